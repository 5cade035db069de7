"""Build side of the Triton model repository: rendering (render.py) and the build stage (stage.py)."""
