from common import *
import la_test as L
B,T,H,dk,dv=L.B,L.T,L.H,L.dk,L.dv
q=np.random.randn(B,T,H,dk).astype(np.float32); k=np.random.randn(B,T,H,dk).astype(np.float32); v=np.random.randn(B,T,H,dv).astype(np.float32)
a=np.random.randn(B,T,H).astype(np.float32); braw=np.random.randn(B,T,H).astype(np.float32)
a_log=np.random.randn(H).astype(np.float32); dt_bias=np.random.randn(H).astype(np.float32)
sp=lambda z: np.log1p(np.exp(z)); sig=lambda z: 1/(1+np.exp(-z))
g=-np.exp(a_log)*sp(a+dt_bias); beta=sig(braw)
l2=lambda z: z/np.linalg.norm(z,axis=-1,keepdims=True)
R,RS=L.ref(l2(q),l2(k),v,g,beta,np.zeros((B,H,dk,dv)),'gated_delta',1/np.sqrt(dk))
o,fs=sess1('GatedDeltaNet',[('q',q),('k',k),('v',v),('cu',None),('g',a),('b',braw),('s',np.zeros((B,H,dv,dk),np.float32)),('alog',a_log),('dtb',dt_bias)],['o','fs'],
   update_rule='gated_delta',gate_activation='softplus',beta_activation='sigmoid',qk_l2_norm=1)
print('GatedDeltaNet fused softplus gate + sigmoid beta + qk_l2_norm: out err',err(o,R),'state err',err(fs,RS.transpose(0,1,3,2)))
d,bb=sess1('LinearAttentionGate',[('a',a),('dtb',dt_bias),('ds',(-np.exp(a_log)).astype(np.float32)),('b',braw)],['d','beta'])
print('LinearAttentionGate decay err',err(d,g),'beta err',err(bb,beta))
