// A tunable SGEMM in the style of CLBlast's xgemm, written for bench/peers.py.
//
//   C[M, N] = A[M, K] @ B[K, N]     float32, row-major, no transposes, no alpha/beta
//
// Every knob is a preprocessor define (Kernel Tuner prepends them; so does the bench
// when it re-times a config through autosched's harness):
//
//   MSIZE, NSIZE, KSIZE   the problem (multiples of MWG, NWG, KWG: no bounds checks)
//   MWG, NWG   rows and columns of C computed by one work-group
//   KWG        depth of the k chunk per outer iteration (the local tile depth when staging)
//   MDIMC      work-items per work-group along M (NDRange dimension 1)
//   NDIMC      work-items per work-group along N (NDRange dimension 0)
//   VWN        vector width along N: B loads, accumulators and C stores are floatVWN
//   VWM        vector width of the A loads, along K (K is A's contiguous axis here)
//   KWI        unroll factor of the inner k loop (a multiple of VWM)
//   SA, SB     1: stage each k chunk of A / B in local memory first
//
// Each work-item accumulates a WPTM x WPTN register tile (WPTM = MWG / MDIMC rows,
// WPTN = NWG / NDIMC contiguous columns, NVEC = WPTN / VWN vectors per row). The launch
// is global = (NSIZE / NWG * NDIMC, MSIZE / MWG * MDIMC), local = (NDIMC, MDIMC).

#define WPTM (MWG / MDIMC)
#define WPTN (NWG / NDIMC)
#define NVEC (WPTN / VWN)
#define WGS (MDIMC * NDIMC)

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#if VWN == 1
typedef float floatN;
#define LOADN(p) (*(p))
#define STOREN(v, p) (*(p) = (v))
#else
typedef CAT(float, VWN) floatN;
#define LOADN(p) CAT(vload, VWN)(0, (p))
#define STOREN(v, p) CAT(vstore, VWN)((v), 0, (p))
#endif

#if VWM == 1
typedef float floatM;
#define LOADM(p) (*(p))
#define STOREM(v, p) (*(p) = (v))
#else
typedef CAT(float, VWM) floatM;
#define LOADM(p) CAT(vload, VWM)(0, (p))
#define STOREM(v, p) CAT(vstore, VWM)((v), 0, (p))
#endif

// Where row r / column c of this work-group's tile is read in the current k chunk.
#if SA
#define APTR(r, k) (&Alm[(r) * KWG + (k)])
#else
#define APTR(r, k) (&A[(gm + (r)) * KSIZE + kw + (k)])
#endif
#if SB
#define BPTR(k, c) (&Blm[(k) * NWG + (c)])
#else
#define BPTR(k, c) (&B[(kw + (k)) * NSIZE + gn + (c)])
#endif

__kernel __attribute__((reqd_work_group_size(NDIMC, MDIMC, 1)))
void sgemm(__global const float* restrict A, __global const float* restrict B,
           __global float* restrict C) {
  const int tn = get_local_id(0);
  const int tm = get_local_id(1);
  const int gn = get_group_id(0) * NWG;
  const int gm = get_group_id(1) * MWG;
  const int n0 = tn * WPTN;  // this work-item's first column, within the tile
  const int m0 = tm * WPTM;  // and first row
#if SA
  __local float Alm[MWG * KWG];
#endif
#if SB
  __local float Blm[KWG * NWG];
#endif
#if SA || SB
  const int lid = tm * NDIMC + tn;
#endif

  floatN acc[WPTM][NVEC];
#pragma unroll
  for (int mi = 0; mi < WPTM; mi++) {
#pragma unroll
    for (int ni = 0; ni < NVEC; ni++) {
      acc[mi][ni] = (floatN)(0.0f);
    }
  }

  for (int kw = 0; kw < KSIZE; kw += KWG) {
#if SA
    for (int i = lid; i < MWG * KWG / VWM; i += WGS) {
      const int r = i / (KWG / VWM);
      const int c = (i % (KWG / VWM)) * VWM;
      STOREM(LOADM(&A[(gm + r) * KSIZE + kw + c]), &Alm[r * KWG + c]);
    }
#endif
#if SB
    for (int i = lid; i < KWG * NWG / VWN; i += WGS) {
      const int r = i / (NWG / VWN);
      const int c = (i % (NWG / VWN)) * VWN;
      STOREN(LOADN(&B[(kw + r) * NSIZE + gn + c]), &Blm[r * NWG + c]);
    }
#endif
#if SA || SB
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    for (int kk = 0; kk < KWG; kk += KWI) {
#pragma unroll
      for (int kv = 0; kv < KWI; kv += VWM) {
        floatM a[WPTM];
#pragma unroll
        for (int mi = 0; mi < WPTM; mi++) {
          a[mi] = LOADM(APTR(m0 + mi, kk + kv));
        }
#pragma unroll
        for (int v = 0; v < VWM; v++) {
          floatN b[NVEC];
#pragma unroll
          for (int ni = 0; ni < NVEC; ni++) {
            b[ni] = LOADN(BPTR(kk + kv + v, n0 + ni * VWN));
          }
#pragma unroll
          for (int mi = 0; mi < WPTM; mi++) {
            const float av = ((const float*)&a[mi])[v];
#pragma unroll
            for (int ni = 0; ni < NVEC; ni++) {
              acc[mi][ni] = fma((floatN)(av), b[ni], acc[mi][ni]);
            }
          }
        }
      }
    }
#if SA || SB
    barrier(CLK_LOCAL_MEM_FENCE);  // the next chunk overwrites the local tiles
#endif
  }

#pragma unroll
  for (int mi = 0; mi < WPTM; mi++) {
#pragma unroll
    for (int ni = 0; ni < NVEC; ni++) {
      STOREN(acc[mi][ni], &C[(gm + m0 + mi) * NSIZE + gn + n0 + ni * VWN]);
    }
  }
}
