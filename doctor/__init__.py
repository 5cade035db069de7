"""The draft <-> target doctor, above the build: why acceptance is low, and where a head loads as it is (`python -m
doctor`); the refresh's gate (`gate`); the first check of a finished build on the machine that serves it
(`eagle_check`: `eagle-check`)."""
