"""Serve-time Triton python-backend models (rendered into a model repository by builders/triton/render.py)."""
