import sys, numpy as np, onnxruntime as ort
from pathlib import Path
from hybridrt.graphs.manifest import read_manifest
from hybridrt.runtime.model import Model
d = Path(sys.argv[1]); m = read_manifest(d)
def make(threads, spin):
    so = ort.SessionOptions()
    if threads is not None: so.intra_op_num_threads = threads
    if spin is not None: so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    s = ort.InferenceSession(str(d / m.graph_file), so, providers=["CPUExecutionProvider"])
    return Model(d, m, s, None, ("cpu", 0))
g = {"max_new_tokens": 128, "min_new_tokens": 128, "do_sample": False}
for threads, spin in ((1, None), (2, "1"), (2, "0"), (None, None)):
    model = make(threads, spin)
    model.generate([[5] * 16], max_new_tokens=4)
    dec, pre = [], []
    for s in range(3):
        _, st = model.generate_with_stats(np.random.default_rng(s).integers(3, 32000, 128).tolist(), **g)
        dec.append(st.decode_tokens_per_s); pre.append(st.prefill_ms)
    print(d.parts[-2], d.parts[-1], f"threads={threads} spin={spin}: decode {max(dec):.1f} tok/s, prefill128 {min(pre):.0f} ms", flush=True)
