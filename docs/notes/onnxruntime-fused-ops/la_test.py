from common import *
def ref(q,k,v,g,beta,S0,rule,scale):
    # q (B,T,H,dk) k (B,T,H,dk) v (B,T,H,dv) g,beta (B,T,H); S (B,H,dk,dv)
    B,T,H,dk=q.shape; S=S0.astype(np.float64).copy(); out=np.zeros((B,T,H,v.shape[-1]))
    for t in range(T):
        for bb in range(B):
            for hh in range(H):
                s=S[bb,hh]; kk=k[bb,t,hh]; vv=v[bb,t,hh]
                if rule in('gated','gated_delta'): s=np.exp(g[bb,t,hh])*s
                if rule in('delta','gated_delta'): s=s+beta[bb,t,hh]*np.outer(kk, vv - s.T@kk)
                else: s=s+np.outer(kk,vv)
                S[bb,hh]=s; out[bb,t,hh]=scale*(s.T@q[bb,t,hh])
    return out,S
B,T,H,dk,dv=2,6,2,8,4
q=np.random.randn(B,T,H,dk).astype(np.float32); k=np.random.randn(B,T,H,dk).astype(np.float32)
k/=np.linalg.norm(k,axis=-1,keepdims=True); v=np.random.randn(B,T,H,dv).astype(np.float32)
g=(-np.random.rand(B,T,H)).astype(np.float32); beta=np.random.rand(B,T,H).astype(np.float32)
S0=np.zeros((B,H,dk,dv),np.float32)
P=lambda a: a.reshape(a.shape[0],a.shape[1],-1)
for rule in ['linear','gated','delta','gated_delta']:
    scale=1/np.sqrt(dk)
    R,RS=ref(q,k,v,g,beta,S0,rule,scale)
    ins=lambda sl,st: [('q',P(q[:,sl])),('k',P(k[:,sl])),('v',P(v[:,sl])),('s',st),('g',g[:,sl]),('b',beta[:,sl])]
    try:
        o1,s1=sess1('LinearAttention',ins(slice(0,5),S0),['o','s_out'],q_num_heads=H,kv_num_heads=H,update_rule=rule)
        o2,s2=sess1('LinearAttention',ins(slice(5,6),s1),['o','s_out'],q_num_heads=H,kv_num_heads=H,update_rule=rule)
        print(f'LinearAttention {rule:11s}: prefill5 err {err(o1,P(R[:,:5])):.1e} decode err {err(o2,P(R[:,5:6])):.1e} state err {err(s2,RS):.1e} state shape {s2.shape}')
    except Exception as e: print('LinearAttention',rule,'ERR',str(e)[-200:])
# GatedDeltaNet (token-major, V-major state), compare gated_delta with rank-4 (B,S,H,D) spelling
R,RS=ref(q,k,v,g,beta,S0,'gated_delta',1/np.sqrt(dk))
try:
    st0=np.zeros((B,H,dv,dk),np.float32)
    o1,f1=sess1('GatedDeltaNet',[('q',q[:,:5].copy()),('k',k[:,:5].copy()),('v',v[:,:5].copy()),('cu',None),('g',g[:,:5].copy()),('b',beta[:,:5].copy()),('s',st0)],['o','fs'],update_rule='gated_delta')
    o2,f2=sess1('GatedDeltaNet',[('q',q[:,5:].copy()),('k',k[:,5:].copy()),('v',v[:,5:].copy()),('cu',None),('g',g[:,5:].copy()),('b',beta[:,5:].copy()),('s',f1)],['o','fs'],update_rule='gated_delta')
    print(f'GatedDeltaNet rank4: prefill err {err(o1,R[:,:5]):.1e} decode err {err(o2,R[:,5:]):.1e} state(V-major) err {err(f2,RS.transpose(0,1,3,2)):.1e} out shape {o1.shape}')
    # ragged packing with cu_seqlens: row0 5 tokens, row1 3 tokens
    tq=np.concatenate([q[0,:5],q[1,:3]]); tk=np.concatenate([k[0,:5],k[1,:3]]); tv=np.concatenate([v[0,:5],v[1,:3]]); tg=np.concatenate([g[0,:5],g[1,:3]]); tb=np.concatenate([beta[0,:5],beta[1,:3]])
    o,fs=sess1('GatedDeltaNet',[('q',tq),('k',tk),('v',tv),('cu',np.array([0,5,8],np.int32)),('g',tg),('b',tb),('s',st0)],['o','fs'],update_rule='gated_delta')
    R1,RS1=ref(q[1:2,:3],k[1:2,:3],v[1:2,:3],g[1:2,:3],beta[1:2,:3],S0[1:2],'gated_delta',1/np.sqrt(dk))
    print(f'GatedDeltaNet ragged cu_seqlens: row0 err {err(o[:5],R[0,:5]):.1e} row1 err {err(o[5:],R1[0]):.1e} row1 state err {err(fs[1],RS1[0].transpose(0,2,1)):.1e}')
except Exception as e: print('GatedDeltaNet ERR',str(e)[-300:])
# Mamba2-as-GatedDeltaNet 'gated' with inverse GQA: G=1 group for B/C (q/k), Hv=2 heads of x; scale=1
G,Hv,N,Pd=1,2,8,4
Cm=np.random.randn(B,T,G,N).astype(np.float32); Bm=np.random.randn(B,T,G,N).astype(np.float32); x=np.random.randn(B,T,Hv,Pd).astype(np.float32)
dt=np.random.rand(B,T,Hv).astype(np.float32); A=-np.random.rand(Hv).astype(np.float32)
R,RS=ref(np.repeat(Cm,Hv,2),np.repeat(Bm,Hv,2),x*dt[...,None],dt*A,None,np.zeros((B,Hv,N,Pd)),'gated',1.0)
try:
    o,fs=sess1('GatedDeltaNet',[('q',Cm),('k',Bm),('v',(x*dt[...,None]).astype(np.float32)),('cu',None),('g',(dt*A).astype(np.float32)),('b',None),('s',np.zeros((B,Hv,Pd,N),np.float32))],['o','fs'],update_rule='gated',scale=1.0)
    print(f'GatedDeltaNet as Mamba2 SSM (gated, Hq=Hk=1, Hv=2, scale=1): err {err(o,R):.1e} state err {err(fs,RS.transpose(0,1,3,2)):.1e}')
except Exception as e: print('GDN mamba2 ERR',str(e)[-300:])
try:
    o,s=sess1('LinearAttention',[('q',P(Cm)),('k',P(Bm)),('v',P((x*dt[...,None]).astype(np.float32))),('s',np.zeros((B,1,N,Pd*Hv),np.float32)),('g',(dt*A).astype(np.float32)),('b',None)],['o','s_out'],q_num_heads=1,kv_num_heads=1,update_rule='gated',scale=1.0)
    print('LinearAttention Hq=Hkv=1 with Hv=2 decay per v-head -> shape',o.shape)
except Exception as e: print('LinearAttention mamba2 mapping ERR',str(e)[-200:])
