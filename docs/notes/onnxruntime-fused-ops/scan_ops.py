import numpy as np, onnx, onnxruntime as ort, time
from onnx import helper as h, TensorProto as TP
def sess(nodes, inputs, outputs):
    vis=[h.make_tensor_value_info(n, TP.FLOAT, s) for n,s in inputs]
    g=h.make_graph(nodes,'g',vis,[onnx.ValueInfoProto(name=o) for o in outputs])
    m=h.make_model(g, opset_imports=[h.make_opsetid('',20), h.make_opsetid('com.microsoft',1)]); m.ir_version=10
    so=ort.SessionOptions(); so.intra_op_num_threads=1
    return ort.InferenceSession(m.SerializeToString(), so, providers=['CPUExecutionProvider'])
def t(s, feeds, n=50):
    s.run(None, feeds)
    t0=time.perf_counter()
    for _ in range(n): out=s.run(None, feeds)
    return (time.perf_counter()-t0)/n*1e3, out
rng=np.random.default_rng(0)
# Mamba1 dims
for L in (1, 128):
    b,H,n=1,1536,16
    C=rng.standard_normal((b,L,n)).astype(np.float32); B=rng.standard_normal((b,L,n)).astype(np.float32)
    xdt=rng.standard_normal((b,L,H)).astype(np.float32)*0.1; dec=-np.abs(rng.standard_normal((b,L,H,n))).astype(np.float32)*0.1
    h0=rng.standard_normal((b,H,n)).astype(np.float32)
    # LinearAttention with expand (current)
    nodes=[h.make_node('Unsqueeze',['C','ax2'],['Cu']), h.make_node('Expand',['Cu','tile'],['Ce']), h.make_node('Reshape',['Ce','packed'],['q']),
           h.make_node('Unsqueeze',['B','ax2'],['Bu']), h.make_node('Expand',['Bu','tile'],['Be']), h.make_node('Reshape',['Be','packed'],['k']),
           h.make_node('Reshape',['dec','packed'],['g']), h.make_node('Unsqueeze',['h0','ax3'],['past']),
           h.make_node('LinearAttention',['q','k','xdt','past','g'],['y','st'],domain='com.microsoft',update_rule='gated',q_num_heads=H,kv_num_heads=H,scale=1.0)]
    consts={'ax2':np.array([2]),'ax3':np.array([3]),'tile':np.array([1,1,H,1]),'packed':np.array([0,0,-1])}
    def mk(nodes, extra_init, inputs, outputs):
        vis=[h.make_tensor_value_info(nm, TP.FLOAT, s) for nm,s in inputs]
        inits=[onnx.numpy_helper.from_array(v.astype(np.int64), k) for k,v in extra_init.items()]
        gg=h.make_graph(nodes,'g',vis,[onnx.ValueInfoProto(name=o) for o in outputs], inits)
        m=h.make_model(gg, opset_imports=[h.make_opsetid('',20), h.make_opsetid('com.microsoft',1)]); m.ir_version=10
        so=ort.SessionOptions(); so.intra_op_num_threads=1
        return ort.InferenceSession(m.SerializeToString(), so, providers=['CPUExecutionProvider'])
    ins=[('C',[b,L,n]),('B',[b,L,n]),('xdt',[b,L,H]),('dec',[b,L,H,n]),('h0',[b,H,n])]
    sLA=mk(nodes, consts, ins, ['y','st'])
    nodes2=[h.make_node('Unsqueeze',['C','ax2'],['q']), h.make_node('Unsqueeze',['B','ax2'],['k']), h.make_node('Unsqueeze',['xdt','ax3'],['v']),
            h.make_node('Unsqueeze',['h0','ax2'],['s0']),
            h.make_node('GatedDeltaNet',['q','k','v','','dec','','s0'],['y4','st4'],domain='com.microsoft',update_rule='gated',scale=1.0),
            h.make_node('Squeeze',['y4','ax3'],['y']), h.make_node('Squeeze',['st4','ax2'],['st'])]
    sG=mk(nodes2, {'ax2':np.array([2]),'ax3':np.array([3])}, ins, ['y','st'])
    f={'C':C,'B':B,'xdt':xdt,'dec':dec,'h0':h0}
    ta,(ya,sa)=t(sLA,f, 20 if L>1 else 200); tg,(yg,sg)=t(sG,f, 20 if L>1 else 200)
    print(f"mamba1 L={L}: LinearAttention+Expand {ta:.3f} ms, GatedDeltaNet {tg:.3f} ms, |dy| {np.abs(ya.reshape(yg.shape)-yg).max():.2e} |ds| {np.abs(sa.reshape(sg.shape)-sg).max():.2e}")
    # Mamba2 dims granite-h-125m: d_inner 1536, heads 48? P=32, n=128? use H=24,P=64,n=128,G=1
    H2,P,n2,G=24,64,128,1
    xdt2=rng.standard_normal((b,L,H2,P)).astype(np.float32)*0.1; g2=-np.abs(rng.standard_normal((b,L,H2))).astype(np.float32)*0.1
    B2=rng.standard_normal((b,L,G,n2)).astype(np.float32)*0.1; C2=rng.standard_normal((b,L,G,n2)).astype(np.float32)*0.1
    h2=rng.standard_normal((b,H2,P,n2)).astype(np.float32)
    ins2=[('xdt',[b,L,H2,P]),('g',[b,L,H2]),('B',[b,L,G,n2]),('C',[b,L,G,n2]),('h0',[b,H2,P,n2])]
    nodesLA=[h.make_node('Expand',['B','tile2'],['Be']), h.make_node('Expand',['C','tile2'],['Ce']),
             h.make_node('Reshape',['Ce','packed'],['q']), h.make_node('Reshape',['Be','packed'],['k']), h.make_node('Reshape',['xdt','packed'],['v']),
             h.make_node('Transpose',['h0'],['past'],perm=[0,1,3,2]),
             h.make_node('LinearAttention',['q','k','v','past','g'],['yf','stT'],domain='com.microsoft',update_rule='gated',q_num_heads=H2,kv_num_heads=H2,scale=1.0),
             h.make_node('Transpose',['stT'],['st'],perm=[0,1,3,2])]
    sLA2=mk(nodesLA, {'tile2':np.array([1,1,H2,1]),'packed':np.array([0,0,-1])}, ins2, ['yf','st'])
    sG2=mk([h.make_node('GatedDeltaNet',['C','B','xdt','','g','','h0'],['y','st'],domain='com.microsoft',update_rule='gated',scale=1.0)], {}, ins2, ['y','st'])
    f2={'xdt':xdt2,'g':g2,'B':B2,'C':C2,'h0':h2}
    ta,(ya,sa)=t(sLA2,f2, 20 if L>1 else 200); tg,(yg,sg)=t(sG2,f2, 20 if L>1 else 200)
    print(f"mamba2 L={L}: LinearAttention+Expand+Transposes {ta:.3f} ms, GatedDeltaNet {tg:.3f} ms, |dy| {np.abs(ya.reshape(yg.shape)-yg).max():.2e} |ds| {np.abs(sa.reshape(sg.shape)-sg).max():.2e}")
