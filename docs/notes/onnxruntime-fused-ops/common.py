import numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as TP
np.random.seed(1)
def sess1(op, inputs, outputs, domain='com.microsoft', opset=21, **attrs):
    """inputs: list of (name, np.array or None for omitted). outputs: list of names ('' to skip)."""
    names=[n if a is not None else '' for n,a in inputs]
    vis=[h.make_tensor_value_info(n,onnx.helper.np_dtype_to_tensor_dtype(a.dtype),list(a.shape)) for n,a in inputs if a is not None]
    node=h.make_node(op,names,outputs,domain=domain,**attrs)
    outs=[onnx.ValueInfoProto(name=o) for o in outputs if o]
    m=h.make_model(h.make_graph([node],'g',vis,outs),opset_imports=[h.make_opsetid('',opset),h.make_opsetid('com.microsoft',1)]); m.ir_version=10
    so=ort.SessionOptions(); so.intra_op_num_threads=1
    s=ort.InferenceSession(m.SerializeToString(),so,providers=['CPUExecutionProvider'])
    feeds={n:a for n,a in inputs if a is not None}
    return s.run(None,feeds)
def err(a,b): return float(np.abs(np.asarray(a,np.float64)-np.asarray(b,np.float64)).max())
def rms(x,w,eps): return x/np.sqrt((x.astype(np.float64)**2).mean(-1,keepdims=True)+eps)*w
