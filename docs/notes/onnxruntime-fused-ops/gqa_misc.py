import os, sys; sys.path.insert(0,'/tmp/ortres')
import numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as TP
def run(D, rot, packed=False, softcap=0.0):
    B,NH,KVH,S,MAX=1,4,2,3,8
    names=['qkv','','','pk','pv','sk','tot','cos','sin'] if packed else ['q','k','v','pk','pv','sk','tot','cos','sin']
    if not rot: names=names[:7]
    node=h.make_node('GroupQueryAttention',names,['o','ok','ov'],domain='com.microsoft',num_heads=NH,kv_num_heads=KVH,do_rotary=rot,softcap=softcap)
    feeds={}
    if packed: feeds['qkv']=np.random.randn(B,S,(NH+2*KVH)*D).astype(np.float32)
    else: feeds.update(q=np.random.randn(B,S,NH*D).astype(np.float32),k=np.random.randn(B,S,KVH*D).astype(np.float32),v=np.random.randn(B,S,KVH*D).astype(np.float32))
    feeds.update(pk=np.zeros((B,KVH,MAX,D),np.float32),pv=np.zeros((B,KVH,MAX,D),np.float32),sk=np.array([S-1],np.int32),tot=np.array(S,np.int32))
    if rot: feeds.update(cos=np.ones((MAX,D//2),np.float32),sin=np.zeros((MAX,D//2),np.float32))
    ins=[h.make_tensor_value_info(n,onnx.helper.np_dtype_to_tensor_dtype(a.dtype),list(a.shape)) for n,a in feeds.items()]
    m=h.make_model(h.make_graph([node],'g',ins,[onnx.ValueInfoProto(name=n) for n in ['o','ok','ov']]),opset_imports=[h.make_opsetid('',21),h.make_opsetid('com.microsoft',1)]); m.ir_version=10
    try:
        s=ort.InferenceSession(m.SerializeToString(),providers=['CPUExecutionProvider']); o=s.run(None,feeds); return f'OK out {o[0].shape} present {o[1].shape}'
    except Exception as e: return 'ERR '+str(e).split('Message:')[-1][:150]
for D in [8,12,20,24]: print('head_size',D,'no rotary:',run(D,0),'| rotary:',run(D,1))
print('packed QKV D=16 rotary:',run(16,1,packed=True))
print('softcap=30 D=16:',run(16,1,softcap=30.0))
