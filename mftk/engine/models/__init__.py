"""Model families' spec builders (``<family>/spec.py``); the family table is `mftk.config.families`, the
Hugging Face name mappings live with the other checkpoint formats in `mftk.ckpt.hf`."""
