"""Device profiles and model architecture specs: the numbers that decide bytes, FLOPs and seconds.

`devices` is the bottom of the import graph: it imports nothing from `sim`, `traces`, `real` or
`analysis`. Units: bytes (int), seconds (float), bytes/s and FLOP/s (float).
"""

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec, list_models, load_model
from devices.schema import DeviceProfile, list_profiles, load_profile

__all__ = [
    "DeviceProfile",
    "FlashsimError",
    "ModelSpec",
    "list_models",
    "list_profiles",
    "load_model",
    "load_profile",
]
