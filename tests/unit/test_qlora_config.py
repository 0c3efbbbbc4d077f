"""Where QLoRA cannot apply it is refused with the reason, and a missing bitsandbytes names its install."""

from __future__ import annotations

import sys

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError, ModelError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.method=full"], "quantized weights cannot be trained; set train.method=lora"),
        (["train.strategy=fsdp"], r"cannot be sharded or offloaded \(FSDP, DeepSpeed ZeRO-3\); set train.strategy=ddp"),
        (["train.strategy=deepspeed"], "cannot be sharded or offloaded"),
    ],
)
def test_qlora_is_refused_where_it_cannot_apply(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["lora.quantize=nf4", *overrides])


def test_a_missing_bitsandbytes_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from rayft.models.loading import quantization

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ModelError, match=r"lora.quantize='nf4' needs bitsandbytes: pip install 'rayft\[qlora\]'"):
        quantization("nf4", "cpu")
