from common import *
import onnxruntime as ort
ins=[h.make_tensor_value_info(n,TP.FLOAT,s) for n,s in [('q',[1,3,8]),('k',[1,3,8]),('v',[1,3,4]),('st',[1,1,8,4]),('g',[1,3,1]),('b',[1,3,1])]]
node=h.make_node('LinearAttention',['q','k','v','st','g','b'],['o','s'],domain='',q_num_heads=1,kv_num_heads=1)
m=h.make_model(h.make_graph([node],'g',ins,[onnx.ValueInfoProto(name='o'),onnx.ValueInfoProto(name='s')]),opset_imports=[h.make_opsetid('',27)]); m.ir_version=11
so=ort.SessionOptions(); so.graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL; so.optimized_model_filepath='/tmp/ortres/la27.onnx'
ort.InferenceSession(m.SerializeToString(),so,providers=['CPUExecutionProvider']); mm=onnx.load(so.optimized_model_filepath); print([(n.domain,n.op_type) for n in mm.graph.node][:30], len(mm.graph.node))
