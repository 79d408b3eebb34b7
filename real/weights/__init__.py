"""The weight store: FFN neuron bundles on disk in a flash layout, resident tensors, the manifest and
its integrity record (`store`, `store_integrity`), written atomically (`store_writer`) by conversion
from a real model or random weights (`convert`), with the element types and safetensors I/O they use.
"""
