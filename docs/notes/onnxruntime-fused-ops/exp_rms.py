import torch, onnx, warnings, sys
warnings.filterwarnings('ignore')
class Manual(torch.nn.Module):
    def __init__(s): super().__init__(); s.w=torch.nn.Parameter(torch.randn(16))
    def forward(s,x,r):
        h=x+r
        v=h.pow(2).mean(-1,keepdim=True)
        return h*torch.rsqrt(v+1e-6)*s.w, h
class Builtin(torch.nn.Module):
    def __init__(s): super().__init__(); s.n=torch.nn.RMSNorm(16,eps=1e-6)
    def forward(s,x,r):
        h=x+r
        return s.n(h), h
for cls in (Manual,Builtin):
  for opset in (None,23):
    try:
        kw={} if opset is None else {'opset_version':opset}
        ep=torch.onnx.export(cls().eval(),(torch.randn(2,3,16),torch.randn(2,3,16)),f'/tmp/ortres/{cls.__name__}_{opset}.onnx',dynamo=True,**kw)
        m=onnx.load(f'/tmp/ortres/{cls.__name__}_{opset}.onnx')
        print(cls.__name__, 'opset',[ (o.domain,o.version) for o in m.opset_import], [n.op_type for n in m.graph.node])
    except Exception as e: print(cls.__name__,opset,'ERR',str(e)[:300])
