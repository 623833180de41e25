from common import *
x=np.random.randn(2,3,64).astype(np.float32); s=np.random.randn(2,3,64).astype(np.float32); w=np.random.randn(64).astype(np.float32); b=np.random.randn(64).astype(np.float32); eps=1e-6
y,=sess1('SimplifiedLayerNormalization',[('x',x),('w',w)],['y'],domain='',axis=-1,epsilon=eps)
print('SimplifiedLayerNormalization (ai.onnx domain, ORT contrib) err',err(y,rms(x,w,eps)))
y,inv=sess1('SimplifiedLayerNormalization',[('x',x),('w',w)],['y','inv'],domain='',axis=-1,epsilon=eps)
print('  inv_std_var shape',inv.shape, 'err', err(inv,1/np.sqrt((x.astype(np.float64)**2).mean(-1,keepdims=True)+eps)))
o=sess1('SkipSimplifiedLayerNormalization',[('x',x),('s',s),('w',w)],['y','mean','inv','sum'],epsilon=eps)
print('SkipSimplifiedLayerNormalization outputs', [a.shape for a in o], 'y err',err(o[0],rms(x+s,w,eps)),'sum err',err(o[3],x+s))
o=sess1('SkipSimplifiedLayerNormalization',[('x',x),('s',s),('w',w),('b',b)],['y','','','sum'],epsilon=eps)
print('  with bias y err',err(o[0],rms(x+s+b,w,eps)),'sum err',err(o[1],x+s+b))
o=sess1('SkipSimplifiedLayerNormalization',[('x',x[0]),('s',s[0]),('w',w)],['y','','','sum'],epsilon=eps)
print('  2D (tokens,hidden) y err',err(o[0],rms(x[0]+s[0],w,eps)))
try:
    o=sess1('SkipSimplifiedLayerNormalization',[('x',x),('s',s[:1]),('w',w)],['y','','','sum'],epsilon=eps); print('  broadcast skip (1,S,H) y err',err(o[0],rms(x+s[:1],w,eps)))
except Exception as e: print('  broadcast skip ERR',str(e)[-150:])
y,=sess1('RMSNormalization',[('x',x),('w',w)],['y'],domain='',opset=23,axis=-1,epsilon=eps)
print('RMSNormalization (ai.onnx opset 23) err',err(y,rms(x,w,eps)))
# GatedRMSNorm: per-head groups of C=16
C=16; wc=np.random.randn(C).astype(np.float32); z=np.random.randn(2,3,64).astype(np.float32)
for act in ['silu','sigmoid']:
    y,=sess1('GatedRMSNorm',[('x',x),('w',wc),('z',z)],['y'],activation=act,epsilon=eps)
    g=z/(1+np.exp(-z)) if act=='silu' else 1/(1+np.exp(-z))
    ref=(rms(x.reshape(2,3,4,C),wc,eps).reshape(2,3,64))*g
    print('GatedRMSNorm',act,'group C=16 err',err(y,ref))
# Mamba2 (gate before norm: norm(x*silu(z))) check expressible? no -- GatedRMSNorm gates AFTER norm
y,=sess1('BranchwiseRMSNorm',[('x',x),('w',w)],['y'],num_branches=4,epsilon=eps)
print('BranchwiseRMSNorm num_branches=4 (x flattened C*H, w shape C*H) err vs per-16-group rms', err(y, rms(x.reshape(2,3,4,16),w.reshape(4,16),eps).reshape(2,3,64)))
