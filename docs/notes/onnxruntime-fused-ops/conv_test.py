from common import *
B,C,K=2,6,4
w=np.random.randn(C,1,K).astype(np.float32); b=np.random.randn(C).astype(np.float32)
xs=np.random.randn(B,C,7).astype(np.float32)
def ref(x, act):  # full causal depthwise conv over whole seq from zero state
    xp=np.concatenate([np.zeros((B,C,K-1),np.float32),x],-1)
    y=np.stack([(xp[:,:,t:t+K]*w[:,0]).sum(-1) for t in range(x.shape[-1])],-1)+b[:,None]
    return y/(1+np.exp(-y)) if act=='silu' else y
for act in ['none','silu']:
    R=ref(xs,act)
    y1,st=sess1('CausalConvWithState',[('x',xs[:,:,:5]),('w',w),('b',b),('st',np.zeros((B,C,K-1),np.float32))],['y','st_out'],activation=act)
    y2,st2=sess1('CausalConvWithState',[('x',xs[:,:,5:6]),('w',w),('b',b),('st',st)],['y','st_out'],activation=act)
    y3,st3=sess1('CausalConvWithState',[('x',xs[:,:,6:7]),('w',w),('b',b),('st',st2)],['y','st_out'],activation=act)
    print(f'CausalConvWithState ch-first act={act}: prefill5 err {err(y1,R[:,:,:5]):.1e} decode err {err(y2,R[:,:,5:6]):.1e},{err(y3,R[:,:,6:7]):.1e} state shape {st.shape} state==last K-1 inputs {err(st3,xs[:,:,4:7])}')
    # no past_state on first call
    y0,_=sess1('CausalConvWithState',[('x',xs[:,:,:5]),('w',w),('b',b),('st',None)],['y','st_out'],activation=act)
    print('   omitted past_state err',err(y0,R[:,:,:5]))
    # channels_last
    xl=xs.transpose(0,2,1).copy()
    y1,st=sess1('CausalConvWithState',[('x',xl[:,:5]),('w',w),('b',b),('st',np.zeros((B,K-1,C),np.float32))],['y','st_out'],activation=act,channels_last=1)
    y2,st2=sess1('CausalConvWithState',[('x',xl[:,5:6]),('w',w),('b',b),('st',st)],['y','st_out'],activation=act,channels_last=1)
    print(f'   channels_last: prefill err {err(y1,R[:,:,:5].transpose(0,2,1)):.1e} decode err {err(y2,R[:,:,5:6].transpose(0,2,1)):.1e} state shape {st.shape}')
# short prompt (L < K-1)
y1,st=sess1('CausalConvWithState',[('x',xs[:,:,:2]),('w',w),('b',b),('st',np.zeros((B,C,K-1),np.float32))],['y','st_out'])
print('short prompt L=2 state', err(st, np.concatenate([np.zeros((B,C,1)),xs[:,:,:2]],-1)))
# Varlen on CPU
try:
    tok=np.concatenate([xs[0,:,:5].T, xs[1,:,:3].T]).astype(np.float32)   # (8,C)
    cu=np.array([0,5,8],np.int32)
    y,fs=sess1('VarlenCausalConvWithState',[('x',tok),('w',w),('cu',cu),('b',b),('st',np.zeros((B,C,K-1),np.float32))],['y','fs'],activation='silu')
    R=ref(xs,'silu')
    print('VarlenCausalConvWithState CPU err', err(y[:5],R[0,:,:5].T), err(y[5:],R[1,:,:3].T), 'final_state', fs.shape, err(fs[0],xs[0,:,2:5]), err(fs[1],xs[1,:,0:3]))
except Exception as e: print('Varlen ERR',str(e)[-200:])
# ai.onnx CausalConvWithState (opset 27) registered on CPU?
try: sess1('CausalConvWithState',[('x',xs),('w',w)],['y','s'],domain='',opset=27); print('ai.onnx CausalConvWithState opset27: OK')
except Exception as e: print('ai.onnx CausalConvWithState opset27 ERR',str(e)[-160:])
