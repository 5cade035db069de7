"""EAGLE-1/2 head training: data (ShareGPT + target-regenerated answers), target features, the head, the loop.

Entry point: `python builders/train_head.py configs/train/smollm2-eagle.yaml`. See builders/training/config.py for
every knob and builders/training/loop.py for the loss (SafeAILab/EAGLE eagle/train/main.py recipe).
"""
