import numpy as np, onnx, onnxruntime as ort, logging
from onnxruntime.transformers.optimizer import optimize_model
from onnxruntime.transformers.onnx_model import OnnxModel
from onnxruntime.transformers.fusion_simplified_layernorm import FusionSimplifiedLayerNormalization, FusionSkipSimplifiedLayerNormalization
from onnxruntime.transformers.fusion_options import FusionOptions
src='/tmp/ortres/Manual_None.onnx'
x=np.random.randn(2,3,16).astype(np.float32); r=np.random.randn(2,3,16).astype(np.float32)
def run(m):
    s=ort.InferenceSession(m.SerializeToString() if not isinstance(m,str) else m,providers=['CPUExecutionProvider']); return s.run(None,{'x':x,'r':r})
base=run(src)
def report(tag,m):
    out=run(m); print(f'{tag:28s} ops={[n.op_type for n in m.graph.node]} maxerr={[float(np.abs(a-b).max()) for a,b in zip(out,base)]}')
for mt in ['gpt2','bert']:
    om=optimize_model(src, model_type=mt, num_heads=0, hidden_size=0, opt_level=0)
    report(f'optimize_model {mt}',om.model)
opts=FusionOptions('bert'); 
for k in vars(opts):
    if k.startswith('enable_'): setattr(opts,k,False)
opts.enable_layer_norm=True; opts.enable_skip_layer_norm=True
om=optimize_model(src, model_type='bert', num_heads=0, hidden_size=0, opt_level=0, optimization_options=opts)
report('bert only (skip)LN opts',om.model)
# direct passes
m=OnnxModel(onnx.load(src))
FusionSimplifiedLayerNormalization(m).apply(); report('direct FusionSimplifiedLN',m.model)
FusionSkipSimplifiedLayerNormalization(m).apply(); m.prune_graph(); report('direct +FusionSkipSimplifiedLN',m.model)
for n in m.model.graph.node: print('  ',n.op_type,n.domain,list(n.input),list(n.output),[(a.name,onnx.helper.get_attribute_value(a)) for a in n.attribute])
