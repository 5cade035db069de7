"""The engine's error for a checkpoint it cannot run, in a module of its own: the checkpoint loader
(engines/checkpoint.py) and the readers it loads through (engines/fp8_generic.py) both raise it."""


class CheckpointError(ValueError):
    """A checkpoint the engine cannot run; the message names the file, key or tensor and the fix."""
