# shellcheck shell=bash
# The language model (feature language_model, experiment=stdlib_gpt) on CUDA: flash attention in bf16, then a bf16 +
# compile run (with train/mfu, feature mfu); sourced by scripts/gpu_check.sh ($out, $status); deleting the feature
# deletes this file (docs/features.md).
if python -c "
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.randn(8, 6, 256, 64, device='cuda', dtype=torch.bfloat16)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
" >"$out/lm_flash_attention.log" 2>&1
then echo "PASS lm_flash_attention: scaled_dot_product_attention(is_causal=True) runs on the flash kernel in bf16"
else echo "FAIL lm_flash_attention: no flash kernel for bf16 causal attention (log: $out/lm_flash_attention.log)"; status=1
fi
lm=$out/lm_bf16_compile
lm_run=(experiment=stdlib_gpt "hydra.run.dir=$lm" print_config=false trainer.progress_bar=false precision=bf16)
lm_run+=(trainer.compile=true data.batch_size=64 data.block_size=256 model.n_layer=6 model.n_head=6 model.n_embd=384)
if python train.py "${lm_run[@]}" trainer.max_epochs=2 >"$lm.log" 2>&1 && line=$(python -c "
import json
s = json.load(open('$lm/summary.json')); f = s['final']
line = f\"test/bpb {s['test']['test/bpb']:.4f} {f['train/tokens_per_sec']:,.0f} tokens/s {s['wall_seconds']:.0f}s\"
assert 'train/mfu' in f, 'no train/mfu in summary.json'  # feature: mfu
line += f\" mfu {f['train/mfu']:.1%}\"  # feature: mfu
print(line)
")
then echo "PASS lm_bf16_compile: $line"
else echo "FAIL lm_bf16_compile (log: $lm.log)"; tail -5 "$lm.log"; status=1
fi
