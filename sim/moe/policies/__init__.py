"""Expert-cache policies, one module each; sim/moe/base.py discovers every module here."""
