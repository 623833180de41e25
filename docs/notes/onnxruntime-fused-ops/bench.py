import numpy as np, onnx, onnxruntime as ort, time
from onnx import helper as h, TensorProto as TP, numpy_helper as nh
B,NH,KVH,D,MAX,P=1,8,2,64,1024,512
so=ort.SessionOptions(); so.intra_op_num_threads=1
def mk(nodes,ins,outs,inits=[]):
    m=h.make_model(h.make_graph(nodes,'g',ins,[onnx.ValueInfoProto(name=o) for o in outs],inits),opset_imports=[h.make_opsetid('',21),h.make_opsetid('com.microsoft',1)]); m.ir_version=10
    return ort.InferenceSession(m.SerializeToString(),so,providers=['CPUExecutionProvider'])
def tm(f,n=200):
    for _ in range(10): f()
    t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e6
# GQA decode, shared buffer via IOBinding
g=mk([h.make_node('GroupQueryAttention',['q','k','v','pk','pv','sk','tot'],['o','pk_out','pv_out'],domain='com.microsoft',num_heads=NH,kv_num_heads=KVH)],
  [h.make_tensor_value_info(n,t,s) for n,t,s in [('q',TP.FLOAT,[B,1,NH*D]),('k',TP.FLOAT,[B,1,KVH*D]),('v',TP.FLOAT,[B,1,KVH*D]),('pk',TP.FLOAT,[B,KVH,'P',D]),('pv',TP.FLOAT,[B,KVH,'P',D]),('sk',TP.INT32,[B]),('tot',TP.INT32,[])]],['o','pk_out','pv_out'])
kk=ort.OrtValue.ortvalue_from_numpy(np.random.randn(B,KVH,MAX,D).astype(np.float32)); vv=ort.OrtValue.ortvalue_from_numpy(np.random.randn(B,KVH,MAX,D).astype(np.float32))
io=g.io_binding()
q=np.random.randn(B,1,NH*D).astype(np.float32); k=np.random.randn(B,1,KVH*D).astype(np.float32)
io.bind_cpu_input('q',q); io.bind_cpu_input('k',k); io.bind_cpu_input('v',k); io.bind_ortvalue_input('pk',kk); io.bind_ortvalue_input('pv',vv)
io.bind_cpu_input('sk',np.array([P],np.int32)); io.bind_cpu_input('tot',np.array(P+1,np.int32))
io.bind_output('o'); io.bind_ortvalue_output('pk_out',kk); io.bind_ortvalue_output('pv_out',vv)
print(f'GQA decode (past {P}, shared buffer, iobinding): {tm(lambda: g.run_with_iobinding(io)):.0f} us')
# GQA growing (no share): past len P
pk=np.random.randn(B,KVH,P,D).astype(np.float32)
feeds=dict(q=q,k=k,v=k,pk=pk,pv=pk,sk=np.array([P],np.int32),tot=np.array(P+1,np.int32))
print(f'GQA decode (past {P}, growing, plain run): {tm(lambda: g.run(None,feeds)):.0f} us')
# plain ops: Concat past + GQA-expanded attention via MatMul/Softmax (BNSH)
rep=NH//KVH
nodes=[h.make_node('Concat',['pk','kn'],['K'],axis=2),h.make_node('Concat',['pv','vn'],['V'],axis=2),
 h.make_node('Unsqueeze',['K','ax2'],['K5']),h.make_node('Expand',['K5','shp'],['K5e']),h.make_node('Reshape',['K5e','shp4'],['Ke']),
 h.make_node('Unsqueeze',['V','ax2'],['V5']),h.make_node('Expand',['V5','shp'],['V5e']),h.make_node('Reshape',['V5e','shp4'],['Ve']),
 h.make_node('Transpose',['Ke'],['Kt'],perm=[0,1,3,2]),h.make_node('MatMul',['qn','Kt'],['s']),h.make_node('Mul',['s','sc'],['s2']),
 h.make_node('Softmax',['s2'],['p'],axis=-1),h.make_node('MatMul',['p','Ve'],['o'])]
inits=[nh.from_array(np.array([2],np.int64),'ax2'),nh.from_array(np.array([1,1,rep,1,1],np.int64),'shp'),nh.from_array(np.array([B,NH,-1,D],np.int64),'shp4'),nh.from_array(np.array(1/8,np.float32),'sc')]
pl=mk(nodes,[h.make_tensor_value_info(n,TP.FLOAT,s) for n,s in [('qn',[B,NH,1,D]),('kn',[B,KVH,1,D]),('vn',[B,KVH,1,D]),('pk',[B,KVH,'P',D]),('pv',[B,KVH,'P',D])]],['o','K','V'],inits)
f2=dict(qn=q.reshape(B,NH,1,D),kn=k.reshape(B,KVH,1,D),vn=k.reshape(B,KVH,1,D),pk=pk,pv=pk)
print(f'plain Concat+Expand+MatMul+Softmax decode (past {P}): {tm(lambda: pl.run(None,f2)):.0f} us')
# CausalConvWithState vs Concat+Conv+Slice decode, C=1024,K=4
C,Kc=1024,4
w=np.random.randn(C,1,Kc).astype(np.float32)
cc=mk([h.make_node('CausalConvWithState',['x','w','','st'],['y','st2'],domain='com.microsoft',activation='silu')],
 [h.make_tensor_value_info(n,TP.FLOAT,s) for n,s in [('x',[1,C,1]),('st',[1,C,Kc-1])]],['y','st2'],[nh.from_array(w,'w')])
fc=dict(x=np.random.randn(1,C,1).astype(np.float32),st=np.random.randn(1,C,Kc-1).astype(np.float32))
print(f'CausalConvWithState(silu) decode C={C}: {tm(lambda: cc.run(None,fc),500):.0f} us')
pc=mk([h.make_node('Concat',['st','x'],['xc'],axis=2),h.make_node('Conv',['xc','w'],['yc'],group=C),h.make_node('Sigmoid',['yc'],['sg']),h.make_node('Mul',['yc','sg'],['y']),
       h.make_node('Slice',['xc','s0','s1','s2'],['st2'])],[h.make_tensor_value_info(n,TP.FLOAT,s) for n,s in [('x',[1,C,1]),('st',[1,C,Kc-1])]],['y','st2'],
      [nh.from_array(w,'w'),nh.from_array(np.array([1],np.int64),'s0'),nh.from_array(np.array([Kc],np.int64),'s1'),nh.from_array(np.array([2],np.int64),'s2')])
print(f'plain Concat+Conv+SiLU+Slice decode C={C}: {tm(lambda: pc.run(None,fc),500):.0f} us')
