"""Records how PyTorch's cuDNN attention builds its graphs on this machine.

Runs SDPA (cuDNN backend, causal, bf16, grouped-query heads) forward and backward once
per head size with cuDNN's and cudnn-frontend's API logs on, so the backend descriptors
that cuDNN's fused attention engines accept can be read from the logs.
Usage: python cudnn_sdpa_log.py OUT_DIR   (sets the log variables itself and re-runs).
"""
import os
import subprocess
import sys

out = sys.argv[1]
if os.environ.get("CUDNN_SDPA_LOG_CHILD") != "1":
    os.makedirs(out, exist_ok=True)
    for hd, hq, hk in [(64, 32, 8), (128, 12, 2)]:
        env = dict(os.environ)
        env.update(
            CUDNN_SDPA_LOG_CHILD="1",
            CUDNN_LOGLEVEL_DBG="3",
            CUDNN_LOGDEST_DBG=f"{out}/cudnn_api_hd{hd}.log",
            CUDNN_FRONTEND_LOG_INFO="1",
            CUDNN_FRONTEND_LOG_FILE=f"{out}/cudnn_frontend_hd{hd}.log",
            SDPA_SHAPE=f"{hd},{hq},{hk}",
        )
        r = subprocess.run([sys.executable, __file__, out], env=env)
        print("head_dim", hd, "exit", r.returncode, flush=True)
    sys.exit(0)

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

hd, hq, hk = map(int, os.environ["SDPA_SHAPE"].split(","))
print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), flush=True)
s = 1024
q = torch.randn(1, hq, s, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(1, hk, s, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(1, hk, s, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
print("ok", o.shape, q.grad.shape, k.grad.shape, flush=True)
