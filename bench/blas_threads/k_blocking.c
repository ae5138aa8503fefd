// Which K give OpenBLAS other bits on one thread than on two (docs/benchmarks.md, "OpenBLAS's bits and
// the thread count"). Build: gcc -O2 k_blocking.c -o k_blocking -lopenblas
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
void openblas_set_num_threads(int);
static float* rnd(size_t n, unsigned s){ float* p=malloc(n*4); for(size_t i=0;i<n;i++){ s=s*1664525u+1013904223u; p[i]=((s>>8)/16777216.0f)-0.5f;} return p;}
int differs(int M,int N,int K){
    float *A=rnd((size_t)M*K,1),*B=rnd((size_t)K*N,2),*C1=calloc((size_t)M*N,4),*C2=calloc((size_t)M*N,4);
    openblas_set_num_threads(1); cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,M,N,K,1,A,K,B,N,0,C1,N);
    openblas_set_num_threads(2); cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,M,N,K,1,A,K,B,N,0,C2,N);
    int d=memcmp(C1,C2,(size_t)M*N*4)!=0; free(A);free(B);free(C1);free(C2); return d;
}
int main(){
  printf("fine: "); for(int K=380;K<=540;K+=4) if(differs(256,64,K)) printf("%d ",K); printf("\n");
  printf("mult128 differing: "); for(int K=128;K<=8192;K+=128) if(differs(256,64,K)) printf("%d ",K); printf("\n");
  printf("mult256 M=64 N=768 differing: "); for(int K=256;K<=8192;K+=256) if(differs(64,768,K)) printf("%d ",K); printf("\n");
}
