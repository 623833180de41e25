"""One GroupQueryAttention decode step, float32 vs float16 KV buffer bound in place (notes section 6)."""
import numpy as np, onnx, onnxruntime as ort, time
from onnx import helper as h, TensorProto as T
H, KVH, HD, CAP = 12, 4, 64, 2048
def build(fp16):
    dt = T.FLOAT16 if fp16 else T.FLOAT
    nodes=[]; ins=[h.make_tensor_value_info(n,T.FLOAT,s) for n,s in (("q",[1,1,H*HD]),("k",[1,1,KVH*HD]),("v",[1,1,KVH*HD]))]
    ins += [h.make_tensor_value_info("pk",dt,[1,KVH,CAP,HD]),h.make_tensor_value_info("pv",dt,[1,KVH,CAP,HD]),
            h.make_tensor_value_info("seqlens",T.INT32,[1]),h.make_tensor_value_info("total",T.INT32,[])]
    names=["q","k","v"]
    if fp16:
        for n in ("q","k","v"): nodes.append(h.make_node("Cast",[n],[n+"16"],to=T.FLOAT16))
        names=[n+"16" for n in names]
    nodes.append(h.make_node("GroupQueryAttention",names+["pk","pv","seqlens","total"],["o","pko","pvo"],domain="com.microsoft",num_heads=H,kv_num_heads=KVH))
    outs=[h.make_tensor_value_info("out",T.FLOAT,[1,1,H*HD]),h.make_tensor_value_info("pko",dt,[1,KVH,CAP,HD]),h.make_tensor_value_info("pvo",dt,[1,KVH,CAP,HD])]
    nodes.append(h.make_node("Cast",["o"],["out"],to=T.FLOAT) if fp16 else h.make_node("Identity",["o"],["out"]))
    g=h.make_graph(nodes,"g",ins,outs)
    m=h.make_model(g,opset_imports=[h.make_opsetid("",17),h.make_opsetid("com.microsoft",1)]); m.ir_version=9
    return m.SerializeToString()
for fp16 in (False, True):
    so=ort.SessionOptions(); so.intra_op_num_threads=2
    s=ort.InferenceSession(build(fp16),so,providers=["CPUExecutionProvider"])
    dt=np.float16 if fp16 else np.float32
    pk=np.random.randn(1,KVH,CAP,HD).astype(dt); pv=np.random.randn(1,KVH,CAP,HD).astype(dt)
    b=s.io_binding(); vk=ort.OrtValue.ortvalue_from_numpy(pk); vv=ort.OrtValue.ortvalue_from_numpy(pv)
    b.bind_ortvalue_input("pk",vk); b.bind_ortvalue_input("pv",vv); b.bind_ortvalue_output("pko",vk); b.bind_ortvalue_output("pvo",vv)
    for n,shape in (("q",(1,1,H*HD)),("k",(1,1,KVH*HD)),("v",(1,1,KVH*HD))): b.bind_cpu_input(n,np.random.randn(*shape).astype(np.float32))
    b.bind_output("out","cpu")
    for L in (128, 1900):
        b.bind_cpu_input("seqlens",np.array([L-1],np.int32)); b.bind_cpu_input("total",np.array(L,np.int32))
        for _ in range(20): s.run_with_iobinding(b)
        t=time.perf_counter(); n=300
        for _ in range(n): s.run_with_iobinding(b)
        print("fp16" if fp16 else "fp32", L, f"{(time.perf_counter()-t)/n*1e3:.3f} ms")
