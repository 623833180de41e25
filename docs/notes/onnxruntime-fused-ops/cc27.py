from common import *
x=np.random.randn(1,4,5).astype(np.float32); w=np.random.randn(4,1,3).astype(np.float32)
import onnxruntime as ort
for lvl in ['DISABLE_ALL','ENABLE_BASIC','ENABLE_ALL']:
    names=['x','w']; node=h.make_node('CausalConvWithState',names,['y','s'],domain='')
    m=h.make_model(h.make_graph([node],'g',[h.make_tensor_value_info('x',TP.FLOAT,[1,4,5]),h.make_tensor_value_info('w',TP.FLOAT,[4,1,3])],[onnx.ValueInfoProto(name='y'),onnx.ValueInfoProto(name='s')]),opset_imports=[h.make_opsetid('',27)]); m.ir_version=11
    so=ort.SessionOptions(); so.graph_optimization_level=getattr(ort.GraphOptimizationLevel,'ORT_'+lvl); so.optimized_model_filepath=f'/tmp/ortres/cc27_{lvl}.onnx'
    try:
        ort.InferenceSession(m.SerializeToString(),so,providers=['CPUExecutionProvider']); mm=onnx.load(so.optimized_model_filepath); print(lvl,[(n.domain,n.op_type) for n in mm.graph.node])
    except Exception as e: print(lvl,'ERR',str(e)[-120:])
