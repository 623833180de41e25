import sys; sys.path.insert(0,'/tmp/ortres')
from gqa_test import *
T=8
Q=np.random.randn(B,T,NH,D).astype(np.float32); K=np.random.randn(B,T,KVH,D).astype(np.float32); V=np.random.randn(B,T,KVH,D).astype(np.float32)
rd=D; inv=1.0/(10000**(np.arange(0,rd,2)/rd)); fr=np.outer(np.arange(MAXS),inv)
cos=np.cos(fr).astype(np.float32); sin=np.sin(fr).astype(np.float32)
refs=[ref_full(Q[b],K[b],V[b],cos,sin,rd,0,1) for b in range(B)]
def step(sess, kv, starts, counts, S, use_ql, tot=None):
    q=np.full((B,S,NH,D),99,np.float32); k=np.full((B,S,KVH,D),99,np.float32); v=k.copy()
    for b in range(B):
        q[b,:counts[b]]=Q[b,starts[b]:starts[b]+counts[b]]; k[b,:counts[b]]=K[b,starts[b]:starts[b]+counts[b]]; v[b,:counts[b]]=V[b,starts[b]:starts[b]+counts[b]]
    ends=[s+c for s,c in zip(starts,counts)]
    feeds=dict(q=q.reshape(B,S,-1),k=k.reshape(B,S,-1),v=v.reshape(B,S,-1),past_k=kv[0],past_v=kv[1],cos=cos,sin=sin,
       seqlens_k=np.array([e-1 for e in ends],np.int32),total_seq=np.array(tot if tot else max(ends),np.int32))
    if use_ql: feeds['qlens']=np.array(counts,np.int32)
    out,pk,pv=sess.run(None,feeds); out=out.reshape(B,S,NH,D)
    err=max(np.abs(out[b,:counts[b]]-refs[b][0][starts[b]:ends[b]]).max() if counts[b] else 0 for b in range(B))
    kerr=max(np.abs(pk[b,:,:ends[b]].transpose(1,0,2)-refs[b][1][:ends[b]]).max() for b in range(B))
    return (pk,pv), err, kerr
def scenario(name, use_ql, plan, P=MAXS, tot=None):
    sess=make(1,rd,0,query_seqlens=use_ql)
    kv=(np.zeros((B,KVH,P,D),np.float32),np.zeros((B,KVH,P,D),np.float32))
    starts=[0,0]; res=[]
    for counts,S in plan:
        try:
            kv,e,ke=step(sess,kv,starts,counts,S,use_ql,tot); res.append(f'S={S} counts={counts}: out {e:.1e} K {ke:.1e}')
        except Exception as ex: res.append(f'S={S} counts={counts}: ERR {str(ex).split("Status Message:")[-1][:200]}'); break
        starts=[s+c for s,c in zip(starts,counts)]
    print(name,'|', ' ; '.join(res))
# prompt 5/3 then chunk of 2 tokens per row, then decode
scenario('no_qlens  share', False, [([5,3],5),([2,2],2),([1,1],1)])
scenario('no_qlens  grow ', False, [([5,3],5),([2,2],2),([1,1],1)], P=0)
scenario('qlens     share', True, [([5,3],5),([2,2],2),([1,1],1)])
scenario('qlens ragged   ', True, [([5,3],5),([2,1],2),([1,0],1),([0,3],3)])
scenario('qlens fixedS=4 ', True, [([4,3],4),([3,4],4),([1,1],4)])
scenario('qlens tot=cap  ', True, [([5,3],5),([2,1],2),([1,1],1)], tot=MAXS)
scenario('qlens grow     ', True, [([5,3],5),([2,2],2)], P=0)
scenario('noql tot=cap   ', False, [([5,3],5),([1,1],1),([1,1],1)], tot=MAXS)
# left padding test: row1 has 3 tokens placed at rows 2..4 of the prompt
sess=make(1,rd,0); S=5
q=np.full((B,S,NH,D),0,np.float32); k=np.zeros((B,S,KVH,D),np.float32); v=k.copy()
q[0]=Q[0,:5]; k[0]=K[0,:5]; v[0]=V[0,:5]; q[1,2:]=Q[1,:3]; k[1,2:]=K[1,:3]; v[1,2:]=V[1,:3]
pk=np.zeros((B,KVH,MAXS,D),np.float32)
for sk in ([4,2],[4,4]):
    out,_,_=sess.run(None,dict(q=q.reshape(B,S,-1),k=k.reshape(B,S,-1),v=v.reshape(B,S,-1),past_k=pk,past_v=pk,cos=cos,sin=sin,seqlens_k=np.array(sk,np.int32),total_seq=np.array(5,np.int32)))
    out=out.reshape(B,S,NH,D); print('left-pad seqlens_k',sk,'row1 err', np.abs(out[1,2:]-refs[1][0][:3]).max())
