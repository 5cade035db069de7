"""EAGLE head training: data (ShareGPT + target-regenerated answers), target features, the head, the loop.

Entry point: `python training/train_head.py configs/train/smollm2-eagle.yaml` (EAGLE-1/2, `head: eagle`; loss in
loop.py, SafeAILab/EAGLE eagle/train/main.py recipe) or `configs/train/smollm2-eagle3.yaml` (EAGLE-3 with a reduced
draft vocabulary, `head: eagle3`; eagle3_*.py, SafeAILab/EAGLE eagle/traineagle3 recipe). See config.py for every knob.
"""
