"""llama-cpp-python with llama.cpp's extra (repacked) weight buffers off, for the peers.

llama-cpp-python's ``Llama`` takes no option for ``llama_model_params.use_extra_bufts``;
its default (on) builds repacked copies of the weights, and on AMX CPUs llama.cpp's AMX
kernels crash on any quantized batch of more than one token (ggml-org/llama.cpp #20824;
docs/decisions/0035). So that bare llama.cpp and ``llama_cpp.server`` can serve the 7B /
13B Q4_0 files at all, and with the same mapped weights modelyard serves, this wraps the
public ``llama_model_default_params`` that ``Llama.__init__`` starts from.

    python bench/llama_mapped.py --config_file peer.json   # llama_cpp.server, mapped
"""

from __future__ import annotations

import runpy
import sys
from typing import Any


def use_mapped_weights() -> None:
    """Every ``Llama`` made after this call maps its weights without extra buffers."""
    import llama_cpp.llama_cpp as low

    default = low.llama_model_default_params
    if getattr(default, "mapped_only", False):
        return

    def mapped() -> Any:
        params = default()
        params.use_extra_bufts = False
        return params

    mapped.mapped_only = True  # type: ignore[attr-defined]
    low.llama_model_default_params = mapped


if __name__ == "__main__":
    use_mapped_weights()
    sys.argv[0] = "llama_cpp.server"
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
