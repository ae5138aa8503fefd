// One sgemm call against K split into fixed blocks of 256 and 512 (beta 1), on two threads, at GPT-2
// small's shapes (docs/benchmarks.md). Build: gcc -O2 k_split_cost.c -o k_split_cost -lopenblas
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
void openblas_set_num_threads(int);
static float* rnd(size_t n, unsigned s){ float* p=malloc(n*4); for(size_t i=0;i<n;i++){ s=s*1664525u+1013904223u; p[i]=((s>>8)/16777216.0f)-0.5f;} return p;}
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
void split(int ta,int M,int N,int K,const float*A,int lda,const float*B,int ldb,float*C,int kb){
  for(int k0=0;k0<K;k0+=kb){ int k=K-k0<kb?K-k0:kb;
    const float* Ak = ta? A+(size_t)k0*lda : A+k0; const float* Bk=B+(size_t)k0*ldb;
    cblas_sgemm(CblasRowMajor,ta?CblasTrans:CblasNoTrans,CblasNoTrans,M,N,k,1,Ak,lda,Bk,ldb,k0?1.0f:0.0f,C,N);}
}
int main(){
  openblas_set_num_threads(2);
  int shapes[][4]={{8192,2304,768,0},{8192,768,3072,0},{768,2304,8192,1},{3072,768,8192,1},{768,3072,8192,1}};
  for(int s=0;s<5;s++){
    int M=shapes[s][0],N=shapes[s][1],K=shapes[s][2],ta=shapes[s][3];
    float*A=rnd((size_t)M*K,1),*B=rnd((size_t)K*N,2),*C=malloc((size_t)M*N*4);
    int lda= ta? M: K;
    double best[3]={1e9,1e9,1e9}; int kbs[3]={0,256,512};
    for(int r=0;r<4;r++) for(int v=0;v<3;v++){ double t=now(); if(v==0) cblas_sgemm(CblasRowMajor,ta?CblasTrans:CblasNoTrans,CblasNoTrans,M,N,K,1,A,lda,B,N,0,C,N); else split(ta,M,N,K,A,lda,B,N,C,kbs[v]); t=now()-t; if(t<best[v])best[v]=t;}
    printf("M=%d N=%d K=%d ta=%d: one %.1f ms (%.0f GF/s), K-blocks 256: %.1f ms (%.3fx), 512: %.1f ms (%.3fx)\n",M,N,K,ta,best[0]*1e3,2.0*M*N*K/best[0]/1e9,best[1]*1e3,best[1]/best[0],best[2]*1e3,best[2]/best[0]);
    free(A);free(B);free(C);
  }
}
