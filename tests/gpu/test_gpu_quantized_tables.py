"""The GPU tier: ``lora.quantize_embeddings``' tables built from bf16 weights on CUDA, where
bitsandbytes' kernels differ from its CPU ones (its int8 row quantizer takes float16 alone), read
back close to the weights, looked up as the whole table reads, and the head's gradient equal to the
dequantized matrix's. ``RAYFT_GPU_TIER_DEVICE=cpu`` runs them on the CPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
pytest.importorskip("bitsandbytes", reason="QLoRA needs the qlora extra: pip install 'rayft[qlora]'")


@pytest.mark.parametrize(("kind", "tolerance"), [("nf4", 0.16), ("int8", 0.01)])
def test_a_bf16_table_on_the_device_reads_back_and_carries_the_heads_gradient(
    device: str, kind: str, tolerance: float
) -> None:
    import torch

    from rayft.models.quantized import QuantizedHead, QuantizedTable

    torch.manual_seed(0)
    weight = torch.randn(4096, 576, dtype=torch.bfloat16, device=device)
    table = QuantizedTable(weight, kind)  # type: ignore[arg-type]
    restored = table.dequantized()
    assert table.packed.device.type == device and restored.dtype == torch.bfloat16
    relative = (restored.float() - weight.float()).abs() / weight.abs().amax(dim=1, keepdim=True).float()
    assert relative.max() < tolerance
    ids = torch.randint(0, 4096, (4, 33), device=device)
    assert torch.equal(table(ids), restored[ids])
    hidden = torch.randn(4, 33, 576, dtype=torch.bfloat16, device=device, requires_grad=True)
    QuantizedHead(table, None)(hidden).float().square().mean().backward()
    want = hidden.detach().clone().requires_grad_(True)
    torch.nn.functional.linear(want, restored).float().square().mean().backward()
    assert hidden.grad is not None and want.grad is not None
    torch.testing.assert_close(hidden.grad, want.grad)
