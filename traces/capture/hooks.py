"""Hooks that record every FFN's intermediate activation a (the neurons) of a Hugging Face model.

Gated FFNs (llama, mistral, qwen2/3, gemma, phi3: SwiGLU/GeGLU) compute down(act(gate(x)) * up(x)):
a forward pre-hook on the down projection receives exactly a = act(gate(x)) * up(x), one value per
neuron. Ungated FFNs (opt: fc1 -> activation -> fc2; gpt2: c_fc -> act -> c_proj; falcon, phi)
compute second(act(first(x))): a pre-hook on the second projection receives a = act(first(x)).

A hook only copies its input into a preallocated fp32 buffer [L, T, N] at the current position
(no allocation, no thresholding), so recording costs a few microseconds per layer and token; all
sparsity work happens after generation. The position advances once the last layer has run, so
one forward pass of S tokens fills rows [pos, pos + S) of every layer.
"""

from __future__ import annotations

from typing import Any

from devices.errors import FlashsimError

# Where the decoder layers live, and which module inside a layer consumes the neurons.
LAYER_LISTS = ("model.layers", "model.decoder.layers", "transformer.h", "transformer.layers", "gpt_neox.layers")
SECOND_PROJECTIONS = ("mlp.down_proj", "fc2", "mlp.fc2", "mlp.c_proj", "mlp.dense_4h_to_h")


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def ffn_input_modules(model: Any) -> list[Any]:
    """The module of each decoder layer whose INPUT is the FFN's neuron activations, in layer order."""
    layers = next((ls for ls in (_get(model, p) for p in LAYER_LISTS) if ls is not None), None)
    if layers is None:
        raise FlashsimError(
            f"{type(model).__name__}: cannot find the decoder layers (looked for {', '.join(LAYER_LISTS)})"
        )
    out = []
    for i, layer in enumerate(layers):
        mod = next((m for m in (_get(layer, p) for p in SECOND_PROJECTIONS) if m is not None), None)
        if mod is None:
            raise FlashsimError(
                f"{type(model).__name__} layer {i}: no FFN output projection "
                f"(looked for {', '.join(SECOND_PROJECTIONS)}); this architecture is not supported"
            )
        out.append(mod)
    return out


class FfnPreHooks:
    """Base of the context managers that put one forward pre-hook on each layer's FFN input module
    (`ffn_input_modules`): `_hook(layer)` makes the hook; entering registers them, leaving removes
    them."""

    modules: list[Any]

    def _hook(self, layer: int) -> Any:
        raise NotImplementedError

    def __enter__(self) -> FfnPreHooks:
        self._handles = [m.register_forward_pre_hook(self._hook(i)) for i, m in enumerate(self.modules)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class FfnRecorder(FfnPreHooks):
    """Context manager: while active, every forward pass appends its FFN activations to `buffer`.

        rec = FfnRecorder(model, n_neurons)
        with rec:
            rec.reset(buffer)          # torch fp32 [L, T_max, N]
            model(...)                 # fills rows [0, S) of every layer
        rec.n_recorded                 # rows filled so far
    """

    def __init__(self, model: Any, n_neurons: int):
        self.modules = ffn_input_modules(model)
        self.n_layers = len(self.modules)
        self.n_neurons = n_neurons
        self.buffer: Any = None
        self.n_recorded = 0
        self._handles: list[Any] = []

    def reset(self, buffer: Any) -> None:
        if tuple(buffer.shape[::2]) != (self.n_layers, self.n_neurons):
            raise ValueError(f"buffer must be [{self.n_layers}, T, {self.n_neurons}], got {tuple(buffer.shape)}")
        self.buffer, self.n_recorded = buffer, 0

    def _hook(self, layer: int):
        last = self.n_layers - 1

        def pre_hook(_module: Any, args: tuple) -> None:
            x = args[0]
            n = x.shape[-1]
            if n != self.n_neurons:
                raise RuntimeError(f"layer {layer}: FFN has {n} neurons, the model spec says {self.n_neurons}")
            x = x.reshape(-1, n)  # batch 1: [S, N] whatever the layer's layout
            s, p = x.shape[0], self.n_recorded
            if p + s > self.buffer.shape[1]:
                raise RuntimeError(f"capture buffer overflow: {p + s} tokens > {self.buffer.shape[1]} rows")
            self.buffer[layer, p:p + s].copy_(x)
            if layer == last:
                self.n_recorded = p + s

        return pre_hook

