import numpy as np, onnx, onnxruntime as ort
from onnxruntime.transformers.optimizer import optimize_model
from onnxruntime.transformers.fusion_options import FusionOptions
x=np.random.randn(2,3,16).astype(np.float32); r=np.random.randn(2,3,16).astype(np.float32)
opts=FusionOptions('bert')
for k in vars(opts):
    if k.startswith('enable_') and k!='enable_shape_inference': setattr(opts,k,False)
opts.enable_layer_norm=True; opts.enable_skip_layer_norm=True
om=optimize_model('/tmp/ortres/Manual_None.onnx', model_type='bert', num_heads=0, hidden_size=0, opt_level=0, optimization_options=opts)
print('bert only LN opts + shape_inf', [n.op_type for n in om.model.graph.node])
om=optimize_model('/tmp/ortres/Manual_23.onnx', model_type='bert', num_heads=0, hidden_size=0, opt_level=0)
print('py optimizer on opset23 RMSNormalization', [n.op_type for n in om.model.graph.node])
for f in ['Manual_None','Manual_23']:
  for lvl,name in [(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,'basic'),(ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,'extended'),(ort.GraphOptimizationLevel.ORT_ENABLE_ALL,'all')]:
    so=ort.SessionOptions(); so.graph_optimization_level=lvl; so.optimized_model_filepath=f'/tmp/ortres/{f}_{name}_opt.onnx'
    s=ort.InferenceSession(f'/tmp/ortres/{f}.onnx',so,providers=['CPUExecutionProvider'])
    m=onnx.load(so.optimized_model_filepath)
    print(f, name, [(n.op_type) for n in m.graph.node])
