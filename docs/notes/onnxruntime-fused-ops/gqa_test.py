import numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as TP
np.random.seed(0)
import os
B,NH,KVH,D,MAXS=2,4,2,int(os.environ.get("HD","16")),16
def make(do_rotary=1, rd=D, interleaved=0, query_seqlens=False, local_window=-1):
    ins=[h.make_tensor_value_info('q',TP.FLOAT,[B,'S',NH*D]),
         h.make_tensor_value_info('k',TP.FLOAT,[B,'S',KVH*D]),
         h.make_tensor_value_info('v',TP.FLOAT,[B,'S',KVH*D]),
         h.make_tensor_value_info('past_k',TP.FLOAT,[B,KVH,'P',D]),
         h.make_tensor_value_info('past_v',TP.FLOAT,[B,KVH,'P',D]),
         h.make_tensor_value_info('seqlens_k',TP.INT32,[B]),
         h.make_tensor_value_info('total_seq',TP.INT32,[])]
    names=['q','k','v','past_k','past_v','seqlens_k','total_seq']
    if do_rotary:
        ins+= [h.make_tensor_value_info('cos',TP.FLOAT,[MAXS,rd//2]), h.make_tensor_value_info('sin',TP.FLOAT,[MAXS,rd//2])]
        names+=['cos','sin']
    else: names+=['','']
    if query_seqlens:
        names+=['','','','','','','']; names+=['qlens']  # position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight, query_seqlens
        names=names[:9]+['','','','','','','','qlens']
        ins+=[h.make_tensor_value_info('qlens',TP.INT32,[B])]
    node=h.make_node('GroupQueryAttention',names,['out','present_k','present_v'],domain='com.microsoft',
        num_heads=NH,kv_num_heads=KVH,do_rotary=do_rotary,rotary_interleaved=interleaved,local_window_size=local_window)
    outs=[h.make_tensor_value_info('out',TP.FLOAT,None),h.make_tensor_value_info('present_k',TP.FLOAT,None),h.make_tensor_value_info('present_v',TP.FLOAT,None)]
    m=h.make_model(h.make_graph([node],'g',ins,outs),opset_imports=[h.make_opsetid('',21),h.make_opsetid('com.microsoft',1)])
    m.ir_version=10
    so=ort.SessionOptions(); so.intra_op_num_threads=1
    return ort.InferenceSession(m.SerializeToString(),so,providers=['CPUExecutionProvider'])

def rope_np(x,pos,cos,sin,rd,inter):  # x (S,H,D)
    x=x.copy(); xr=x[...,:rd]
    c=cos[pos][:,None,:]; s=sin[pos][:,None,:]
    if inter: x1,x2=xr[...,0::2],xr[...,1::2]
    else: x1,x2=xr[...,:rd//2],xr[...,rd//2:]
    re=c*x1-s*x2; im=s*x1+c*x2
    if inter: out=np.stack([re,im],-1).reshape(xr.shape)
    else: out=np.concatenate([re,im],-1)
    x[...,:rd]=out; return x

def ref_full(qs,ks,vs,cos,sin,rd,inter,do_rotary):
    # qs: (T,NH,D) all tokens of one row, causal attention, positions 0..T-1
    T=qs.shape[0]; pos=np.arange(T)
    if do_rotary: qs=rope_np(qs,pos,cos,sin,rd,inter); ks=rope_np(ks,pos,cos,sin,rd,inter)
    out=np.zeros_like(qs)
    g=NH//KVH
    for hh in range(NH):
        kh=hh//g
        sc=qs[:,hh]@ks[:,kh].T/np.sqrt(D)
        sc=np.where(np.tril(np.ones((T,T)))>0,sc,-np.inf)
        p=np.exp(sc-sc.max(-1,keepdims=True)); p/=p.sum(-1,keepdims=True)
        out[:,hh]=p@vs[:,kh]
    return out, ks  # rotated keys
