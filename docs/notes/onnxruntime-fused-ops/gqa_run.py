import sys; sys.path.insert(0,'/tmp/ortres')
from gqa_test import *
lens=[5,3]; T=6
Q=np.random.randn(B,T,NH,D).astype(np.float32); K=np.random.randn(B,T,KVH,D).astype(np.float32); V=np.random.randn(B,T,KVH,D).astype(np.float32)
def run_case(mode, do_rotary=1, rd=D, inter=0):
    inv=1.0/(10000**(np.arange(0,rd,2)/rd)); fr=np.outer(np.arange(MAXS),inv)
    cos=np.cos(fr).astype(np.float32); sin=np.sin(fr).astype(np.float32)
    sess=make(do_rotary,rd,inter)
    refs=[ref_full(Q[b,:lens[b]+1],K[b,:lens[b]+1],V[b,:lens[b]+1],cos,sin,rd,inter,do_rotary) for b in range(B)]
    # prompt
    S=5; q=np.zeros((B,S,NH,D),np.float32); k=np.zeros((B,S,KVH,D),np.float32); v=k.copy()
    for b in range(B):
        q[b,:lens[b]]=Q[b,:lens[b]]; k[b,:lens[b]]=K[b,:lens[b]]; v[b,:lens[b]]=V[b,:lens[b]]
        q[b,lens[b]:]=99; k[b,lens[b]:]=99; v[b,lens[b]:]=99   # garbage padding
    P = 0 if mode=='grow' else MAXS
    pk=np.zeros((B,KVH,P,D),np.float32); pv=pk.copy()
    feeds=dict(q=q.reshape(B,S,-1),k=k.reshape(B,S,-1),v=v.reshape(B,S,-1),past_k=pk,past_v=pv,
               seqlens_k=np.array([l-1 for l in lens],np.int32),total_seq=np.array(max(lens),np.int32))
    if do_rotary: feeds.update(cos=cos,sin=sin)
    if mode=='iobind':
        kv_k=ort.OrtValue.ortvalue_from_numpy(pk); kv_v=ort.OrtValue.ortvalue_from_numpy(pv)
        def call(feeds):
            io=sess.io_binding()
            for n,a in feeds.items():
                if n=='past_k': io.bind_ortvalue_input(n,kv_k)
                elif n=='past_v': io.bind_ortvalue_input(n,kv_v)
                else: io.bind_cpu_input(n,a)
            io.bind_output('out'); io.bind_ortvalue_output('present_k',kv_k); io.bind_ortvalue_output('present_v',kv_v)
            sess.run_with_iobinding(io); return io.copy_outputs_to_cpu()[0], kv_k.numpy(), kv_v.numpy()
    else:
        def call(feeds): return sess.run(None,feeds)
    out,prk,prv=call(feeds)
    out=out.reshape(B,S,NH,D)
    e1=max(np.abs(out[b,:lens[b]]-refs[b][0][:lens[b]]).max() for b in range(B))
    ek=max(np.abs(prk[b,:,:lens[b]].transpose(1,0,2)-refs[b][1][:lens[b]]).max() for b in range(B))
    shp=prk.shape
    # decode
    q1=np.stack([Q[b,lens[b]] for b in range(B)])[:,None]; k1=np.stack([K[b,lens[b]] for b in range(B)])[:,None]; v1=np.stack([V[b,lens[b]] for b in range(B)])[:,None]
    feeds.update(q=q1.reshape(B,1,-1),k=k1.reshape(B,1,-1),v=v1.reshape(B,1,-1),seqlens_k=np.array(lens,np.int32),total_seq=np.array(max(lens)+1,np.int32))
    if mode!='iobind': feeds.update(past_k=prk,past_v=prv)
    out2,prk2,prv2=call(feeds); out2=out2.reshape(B,1,NH,D)
    e2=max(np.abs(out2[b,0]-refs[b][0][lens[b]]).max() for b in range(B))
    ek2=max(np.abs(prk2[b,:,:lens[b]+1].transpose(1,0,2)-refs[b][1][:lens[b]+1]).max() for b in range(B))
    print(f'{mode:6s} rot={do_rotary} rd={rd} inter={inter}: prompt out err {e1:.2e} presentK err {ek:.2e} present shape {shp}; decode out err {e2:.2e} presentK err {ek2:.2e} present shape {prk2.shape}')
for mode in ([] if os.environ.get("SKIP") else ["grow","share","iobind"]):
    try: run_case(mode)
    except Exception as ex: print(mode,'ERR',str(ex)[:300])
for (rot,rd,inter) in [(1,D//2,0),(1,D//2,1),(1,16,0)]:
    try: run_case('share',rot,rd,inter)
    except Exception as ex: print('share',rot,rd,inter,'ERR',str(ex)[:300])
