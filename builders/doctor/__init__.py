"""The draft <-> target doctor: why acceptance is low, and where a head loads as it is (`python -m builders.doctor`)."""
