"""Where the inputs come from, for the build, the trainer and the measurements alike: prompt and conversation data
sets (`data`: MT-bench, ShareGPT, prompt files, chat formatting) and target models (`targets`: a `target.model`
value, a directory, a `.gguf` file or `pip:<distribution>`, resolved to a Hugging Face directory). Imports nothing of
ours but core/, and no torch at import time."""
