from common import *
import sys; sys.path.insert(0,'/tmp/ortres')
B,S,H,D,MAXS=2,3,2,16,32
x=np.random.randn(B,S,H*D).astype(np.float32)
def rope_ref(x,pos,cos,sin,rd,inter):
    x=x.reshape(B,S,H,D).copy(); xr=x[...,:rd]; c=cos[pos][:,:,None]; s=sin[pos][:,:,None]
    if inter: x1,x2=xr[...,0::2],xr[...,1::2]
    else: x1,x2=xr[...,:rd//2],xr[...,rd//2:]
    re=c*x1-s*x2; im=s*x1+c*x2
    x[...,:rd]=np.stack([re,im],-1).reshape(xr.shape) if inter else np.concatenate([re,im],-1)
    return x.reshape(B,S,H*D)
pos=np.array([[0,1,2],[5,6,7]],np.int64)
for rd in [16,8,4]:
    inv=1.0/(10000**(np.arange(0,rd,2)/rd)); fr=np.outer(np.arange(MAXS),inv); cos=np.cos(fr).astype(np.float32); sin=np.sin(fr).astype(np.float32)
    for inter in [0,1]:
        r=rope_ref(x,pos,cos,sin,rd,inter)
        try:
            y,=sess1('RotaryEmbedding',[('x',x),('p',pos),('c',cos),('s',sin)],['y'],num_heads=H,rotary_embedding_dim=rd,interleaved=inter)
            a=f'{err(y,r):.1e}'
        except Exception as e: a='ERR '+str(e).split('Message:')[-1][:120]
        try:
            y,=sess1('RotaryEmbedding',[('x',x),('c',cos),('s',sin),('p',pos)],['y'],domain='',opset=23,num_heads=H,rotary_embedding_dim=rd,interleaved=inter)
            b=f'{err(y,r):.1e}'
        except Exception as e: b='ERR '+str(e).split('Message:')[-1][:120]
        print(f'RotaryEmbedding rd={rd} inter={inter}: com.microsoft err {a} | ai.onnx(23) err {b}')
# MatMulNBits 4-bit, block 16, with bias
K,N,bs=32,8,16
W=np.random.randn(K,N).astype(np.float32)
Wb=W.T.reshape(N,K//bs,bs); sc=np.abs(Wb).max(-1)/7; qv=np.clip(np.round(Wb/sc[...,None])+8,0,15).astype(np.uint8)
packed=(qv[...,0::2] | (qv[...,1::2]<<4)).astype(np.uint8)   # (N,kb,bs/2)
deq=((qv.astype(np.float32)-8)*sc[...,None]).reshape(N,K).T
A=np.random.randn(2,3,K).astype(np.float32); bias=np.random.randn(N).astype(np.float32)
y,=sess1('MatMulNBits',[('A',A),('B',packed),('s',sc.astype(np.float32)),('zp',None),('g',None),('bias',bias)],['y'],K=K,N=N,bits=4,block_size=bs)
print('MatMulNBits 4b bs16 +bias err vs dequant matmul', err(y,A@deq+bias), ' quant err vs fp W', err(y,A@W+bias))
for al in [0,4]:
    y,=sess1('MatMulNBits',[('A',A),('B',packed),('s',sc.astype(np.float32))],['y'],K=K,N=N,bits=4,block_size=bs,accuracy_level=al)
    print(f'  accuracy_level={al} err vs dequant {err(y,A@deq):.2e}')
# 8-bit
qv8=np.clip(np.round(Wb/(np.abs(Wb).max(-1)/127)[...,None])+128,0,255).astype(np.uint8); sc8=(np.abs(Wb).max(-1)/127).astype(np.float32)
y,=sess1('MatMulNBits',[('A',A),('B',qv8),('s',sc8)],['y'],K=K,N=N,bits=8,block_size=bs)
print('MatMulNBits 8b err vs dequant',err(y,A@(((qv8.astype(np.float32)-128)*sc8[...,None]).reshape(N,K).T)))
