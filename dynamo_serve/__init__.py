"""NVIDIA Dynamo on the reference engine: the worker (dynamo_serve/worker.py) and `eagle-dynamo serve`
(dynamo_serve/serve.py), which runs a build's Dynamo deployment (<build>/dynamo/, dynamo_serve/layout.py)."""
