import numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as TP, numpy_helper as nh
def build(variant):
    inits=[nh.from_array(np.random.randn(16).astype(np.float32),'w'),nh.from_array(np.array(2.0,np.float32),'two'),
           nh.from_array(np.array([-1],np.int64),'ax'),nh.from_array(np.array(1e-6,np.float32),'eps'),nh.from_array(np.array(1.0,np.float32),'one')]
    n=[h.make_node('Add',['x','r'],['hs']),h.make_node('Pow',['hs','two'],['p']),h.make_node('ReduceMean',['p','ax'],['m'],keepdims=1),
       h.make_node('Add',['m','eps'],['me']),h.make_node('Sqrt',['me'],['s'])]
    if variant=='div_x': n+=[h.make_node('Div',['hs','s'],['nrm'])]
    elif variant=='div_one': n+=[h.make_node('Div',['one','s'],['inv']),h.make_node('Mul',['hs','inv'],['nrm'])]
    elif variant=='recip': n+=[h.make_node('Reciprocal',['s'],['inv']),h.make_node('Mul',['hs','inv'],['nrm'])]
    n+=[h.make_node('Mul',['nrm','w'],['y'])]
    g=h.make_graph(n,'g',[h.make_tensor_value_info('x',TP.FLOAT,['B','S',16]),h.make_tensor_value_info('r',TP.FLOAT,['B','S',16])],
        [h.make_tensor_value_info('y',TP.FLOAT,None),h.make_tensor_value_info('hs',TP.FLOAT,None)],inits)
    m=h.make_model(g,opset_imports=[h.make_opsetid('',20)]); m.ir_version=10; return m
for v in ['div_x','div_one','recip']:
    so=ort.SessionOptions(); so.graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED; so.optimized_model_filepath=f'/tmp/ortres/v_{v}.onnx'
    ort.InferenceSession(build(v).SerializeToString(),so,providers=['CPUExecutionProvider'])
    print(v,[n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node])
# residual consumed by another node (typical decoder) instead of graph output
for v in ['div_x','recip']:
    m=build(v); g=m.graph
    g.node.append(h.make_node('Add',['hs','y'],['z'])); del g.output[:]; g.output.extend([h.make_tensor_value_info('z',TP.FLOAT,None)])
    so=ort.SessionOptions(); so.graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL; so.optimized_model_filepath=f'/tmp/ortres/v2_{v}.onnx'
    ort.InferenceSession(m.SerializeToString(),so,providers=['CPUExecutionProvider'])
    print('residual-consumed',v,[n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node])
    m2=build(v); del m2.graph.output[1]
    so.optimized_model_filepath=f'/tmp/ortres/v3_{v}.onnx'; ort.InferenceSession(m2.SerializeToString(),so,providers=['CPUExecutionProvider'])
    print('residual-unused  ',v,[n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node])
