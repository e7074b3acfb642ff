// Probe (BENCHMARKS.md, "Known gaps"): the outbound NVLink bandwidth each GPU reaches when every
// GPU sends to every other at once (the traffic of an all_gather or of either half of a
// two-shot all_reduce), by copy engines against SM stores and loads. Standalone CUDA C: on the
// GPU machine `nvcc -O3 -arch=sm_90 -o ce bench/probes/ce_all_peers.cu && ./ce 256` (MiB per
// peer). It bounds what any all_reduce without in-switch reduction (NVLink multicast stays off)
// can reach: each member must send 2(n-1)/n of the message.
#include <cstdio>
#include <chrono>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do{cudaError_t e=(x); if(e){printf("err %s line %d\n",cudaGetErrorString(e),__LINE__); exit(1);} }while(0)
const int MAXG=8;
int n; size_t per; // bytes per peer
char* buf[MAXG]; // each: n*per bytes (slot per source) dst region
char* src[MAXG];
cudaStream_t st[MAXG][16];

__global__ void store_k(const int4* __restrict__ s, int4* d0, int4* d1, int4* d2, size_t n16, int npeer){
  // blocks split over peers
  int per_peer_blocks = gridDim.x / npeer;
  int p = blockIdx.x / per_peer_blocks; if (p>=npeer) return;
  int b = blockIdx.x % per_peer_blocks;
  int4* d = p==0?d0:(p==1?d1:d2);
  for(size_t i=(size_t)b*blockDim.x+threadIdx.x;i<n16;i+=(size_t)per_peer_blocks*blockDim.x) d[i]=s[i];
}
__global__ void store_il(const int4* __restrict__ s, int4* d0, int4* d1, int4* d2, size_t n16, int npeer){
  // every block stores to every peer, interleaved
  for(size_t i=(size_t)blockIdx.x*blockDim.x+threadIdx.x;i<n16;i+=(size_t)gridDim.x*blockDim.x){ int4 v=s[i]; d0[i]=v; if(npeer>1) d1[i]=v; if(npeer>2) d2[i]=v; }
}
__global__ void load_k(int4* __restrict__ d, const int4* s0, const int4* s1, const int4* s2, size_t n16, int npeer){
  int per_peer_blocks = gridDim.x / npeer;
  int p = blockIdx.x / per_peer_blocks; if (p>=npeer) return;
  int b = blockIdx.x % per_peer_blocks;
  const int4* s = p==0?s0:(p==1?s1:s2);
  int4* dd = d + p*n16;
  for(size_t i=(size_t)b*blockDim.x+threadIdx.x;i<n16;i+=(size_t)per_peer_blocks*blockDim.x) dd[i]=s[i];
}
void syncall(){ for(int g=0;g<n;g++){ CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); } }
double timeit(void(*f)(int)){
  double best=1e30;
  for(int it=0;it<5;it++){
    syncall();
    auto t0=std::chrono::steady_clock::now();
    for(int g=0;g<n;g++){ CK(cudaSetDevice(g)); f(g); }
    syncall();
    double t=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
    if(t<best) best=t;
  }
  return best;
}
int peer(int g,int k){ return (g+1+k)%n; }
void ce_multi(int g){ for(int k=0;k<n-1;k++){ int p=peer(g,k); CK(cudaMemcpyPeerAsync(buf[p]+g*per,p,src[g],g,per,st[g][k])); } }
void ce_multi2(int g){ for(int k=0;k<n-1;k++){ int p=peer(g,k); for(int h=0;h<2;h++) CK(cudaMemcpyPeerAsync(buf[p]+g*per+h*per/2,p,src[g]+h*per/2,g,per/2,st[g][2*k+h])); } }
void ce_one(int g){ for(int k=0;k<n-1;k++){ int p=peer(g,k); CK(cudaMemcpyPeerAsync(buf[p]+g*per,p,src[g],g,per,st[g][0])); } }
void ce_multi_async(int g){ for(int k=0;k<n-1;k++){ int p=peer(g,k); CK(cudaMemcpyAsync(buf[p]+g*per,src[g],per,cudaMemcpyDefault,st[g][k])); } }
int gblocks=132, gthreads=512;
void sm_store(int g){ store_k<<<gblocks,gthreads,0,st[g][0]>>>((int4*)src[g],(int4*)(buf[peer(g,0)]+g*per),(int4*)(buf[peer(g,1%(n-1))]+g*per),(int4*)(buf[peer(g,2%(n-1))]+g*per),per/16,n-1); }
void sm_store_il(int g){ store_il<<<gblocks,gthreads,0,st[g][0]>>>((int4*)src[g],(int4*)(buf[peer(g,0)]+g*per),(int4*)(buf[peer(g,1%(n-1))]+g*per),(int4*)(buf[peer(g,2%(n-1))]+g*per),per/16,n-1); }
void sm_load(int g){ load_k<<<gblocks,gthreads,0,st[g][0]>>>((int4*)buf[g],(int4*)src[peer(g,0)],(int4*)src[peer(g,1%(n-1))],(int4*)src[peer(g,2%(n-1))],per/16,n-1); }
// hybrid: SM stores to first peer, CE to the others
void hybrid(int g){ store_k<<<gblocks,gthreads,0,st[g][0]>>>((int4*)src[g],(int4*)(buf[peer(g,0)]+g*per),0,0,per/16,1); for(int k=1;k<n-1;k++){int p=peer(g,k); CK(cudaMemcpyPeerAsync(buf[p]+g*per,p,src[g],g,per,st[g][k]));} }
int main(int argc,char**argv){
  CK(cudaGetDeviceCount(&n)); if(n>4) n=4;
  size_t mib = argc>1? atoi(argv[1]):256; per=mib<<20;
  for(int g=0;g<n;g++){ CK(cudaSetDevice(g)); for(int p=0;p<n;p++) if(p!=g) CK(cudaDeviceEnablePeerAccess(p,0));
    CK(cudaMalloc(&buf[g],n*per)); CK(cudaMalloc(&src[g],per)); CK(cudaMemset(src[g],g+1,per)); for(int s=0;s<16;s++) CK(cudaStreamCreateWithFlags(&st[g][s],cudaStreamNonBlocking)); }
  double out=(double)(n-1)*per;
  struct {const char* name; void(*f)(int);} T[]={{"ce_3streams",ce_multi},{"ce_6streams",ce_multi2},{"ce_1stream",ce_one},{"ce_memcpyAsync_3streams",ce_multi_async},{"sm_store_split",sm_store},{"sm_store_interleaved",sm_store_il},{"sm_load_split(in)",sm_load},{"hybrid_sm1_ce2",hybrid}};
  printf("gpus %d, %zu MiB per peer\n",n,mib);
  for(auto&t:T){ double s=timeit(t.f); printf("%-26s %8.1f us  %7.1f GB/s out per GPU\n",t.name,s*1e6,out/s/1e9); }
  int bl[]={66,132,264,528}; int th[]={256,512,1024};
  for(int b:bl) for(int t:th){ gblocks=b; gthreads=t; double s=timeit(sm_store); double s2=timeit(sm_store_il); printf("sm_store blocks %d threads %d: split %.1f GB/s interleaved %.1f GB/s\n",b,t,out/s/1e9,out/s2/1e9);} 
  return 0;
}
