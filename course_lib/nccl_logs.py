"""Real outputs of nccl-tests' all_reduce_perf, for notebook 04 (section 6) and exercise 04.

Source: the Oracle Cloud tutorial "GPUクラスタを構築する" (building a GPU cluster), in the repository
oracle-japan/ocitutorials, file tutorials/_intermediates/spinup-gpu-cluster.md, an earlier version of it
(the page online, https://oracle-japan.github.io/ocitutorials/intermediates/spinup-gpu-cluster/, now shows
later runs of the same test). Copied unchanged, including the ssh warning that mpirun mixed into the
second one. The machines, as that tutorial describes them: BM.GPU4.8 bare-metal instances, each with
8 NVIDIA A100-SXM4-40GB (joined by NVLink inside the machine) and 16 RDMA network ports of 100 Gb/s
(1.6 Tb/s in all), connected by OCI's cluster network (RoCE v2).

    ONE_MACHINE    ./build/all_reduce_perf -b 64 -e 10G -f 2 -t 1 -g 8
                   one process driving the 8 GPUs of one machine
    TWO_MACHINES   mpirun -np 16 --host inst-ks8ls-comp:8,inst-6ejzf-comp:8 ... ./build/all_reduce_perf
                   -b 64 -e 10G -f 2 -t 1 -g 1: 16 processes, one GPU each, on two machines

The columns (nccl-tests' doc/PERFORMANCE.md): size in bytes, count of elements, type, reduction, root
(-1: none), then for the out-of-place and the in-place run: time in microseconds, algbw and busbw in GB/s
(10**9 bytes per second), and the number of wrong elements.

    OLDER_LAYOUT   a third run, by an older nccl-tests, in the layout it printed before the root column was
                   added (and with an "error" column, the largest relative error, where newer versions count
                   #wrong elements): size, count, type, redop, then time, algbw, busbw, error twice. Source: the
                   repository wohlbier/nccl-tests, README.md (commit 33ee81a3ec6c5e8fdd1e61f713a5c5185b000cd1),
                   the all_reduce_perf section of its "Results on dgx-2", copied unchanged from its "Running:"
                   line: ./build/all_reduce_perf -b 8 -e 10240M -f 2 -g 12, one process driving 12 NVIDIA
                   Tesla V100-SXM3-32GB of a DGX-2 (joined by NVSwitch). It is not in ALL_REDUCE_PERF_LOGS
                   (notebook 04 reads those with the newer layout); exercise 04's tests read it too.
"""

__all__ = ["ONE_MACHINE", "TWO_MACHINES", "ALL_REDUCE_PERF_LOGS", "OLDER_LAYOUT", "OLDER_LAYOUT_LOGS"]

ONE_MACHINE = """\
# nThread 1 nGpus 8 minBytes 64 maxBytes 10737418240 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid    944 on inst-ks8ls-comp device  0 [0x0f] NVIDIA A100-SXM4-40GB
#  Rank  1 Group  0 Pid    944 on inst-ks8ls-comp device  1 [0x15] NVIDIA A100-SXM4-40GB
#  Rank  2 Group  0 Pid    944 on inst-ks8ls-comp device  2 [0x51] NVIDIA A100-SXM4-40GB
#  Rank  3 Group  0 Pid    944 on inst-ks8ls-comp device  3 [0x54] NVIDIA A100-SXM4-40GB
#  Rank  4 Group  0 Pid    944 on inst-ks8ls-comp device  4 [0x8d] NVIDIA A100-SXM4-40GB
#  Rank  5 Group  0 Pid    944 on inst-ks8ls-comp device  5 [0x92] NVIDIA A100-SXM4-40GB
#  Rank  6 Group  0 Pid    944 on inst-ks8ls-comp device  6 [0xd6] NVIDIA A100-SXM4-40GB
#  Rank  7 Group  0 Pid    944 on inst-ks8ls-comp device  7 [0xda] NVIDIA A100-SXM4-40GB
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
          64            16     float     sum      -1    32.01    0.00    0.00      0    31.82    0.00    0.00      0
         128            32     float     sum      -1    32.01    0.00    0.01      0    32.15    0.00    0.01      0
         256            64     float     sum      -1    31.75    0.01    0.01      0    32.02    0.01    0.01      0
         512           128     float     sum      -1    32.21    0.02    0.03      0    31.72    0.02    0.03      0
        1024           256     float     sum      -1    32.03    0.03    0.06      0    32.17    0.03    0.06      0
        2048           512     float     sum      -1    31.77    0.06    0.11      0    32.24    0.06    0.11      0
        4096          1024     float     sum      -1    32.13    0.13    0.22      0    32.20    0.13    0.22      0
        8192          2048     float     sum      -1    32.22    0.25    0.44      0    32.14    0.25    0.45      0
       16384          4096     float     sum      -1    32.48    0.50    0.88      0    32.20    0.51    0.89      0
       32768          8192     float     sum      -1    32.02    1.02    1.79      0    32.20    1.02    1.78      0
       65536         16384     float     sum      -1    35.40    1.85    3.24      0    34.20    1.92    3.35      0
      131072         32768     float     sum      -1    38.50    3.40    5.96      0    37.47    3.50    6.12      0
      262144         65536     float     sum      -1    45.21    5.80   10.15      0    44.01    5.96   10.42      0
      524288        131072     float     sum      -1    58.96    8.89   15.56      0    57.54    9.11   15.95      0
     1048576        262144     float     sum      -1    76.71   13.67   23.92      0    77.73   13.49   23.61      0
     2097152        524288     float     sum      -1    112.4   18.66   32.66      0    113.7   18.45   32.28      0
     4194304       1048576     float     sum      -1    134.5   31.18   54.57      0    134.7   31.13   54.48      0
     8388608       2097152     float     sum      -1    185.8   45.15   79.02      0    183.2   45.79   80.12      0
    16777216       4194304     float     sum      -1    245.1   68.46  119.81      0    241.4   69.51  121.65      0
    33554432       8388608     float     sum      -1    398.2   84.26  147.46      0    397.6   84.39  147.68      0
    67108864      16777216     float     sum      -1    589.5  113.84  199.23      0    587.8  114.18  199.81      0
   134217728      33554432     float     sum      -1   1191.2  112.67  197.17      0   1182.6  113.50  198.62      0
   268435456      67108864     float     sum      -1   2121.9  126.50  221.38      0   2110.9  127.17  222.55      0
   536870912     134217728     float     sum      -1   4208.2  127.58  223.26      0   4208.0  127.58  223.27      0
  1073741824     268435456     float     sum      -1   8166.8  131.48  230.08      0   8165.2  131.50  230.13      0
  2147483648     536870912     float     sum      -1    16232  132.30  231.52      0    16238  132.25  231.44      0
  4294967296    1073741824     float     sum      -1    32097  133.81  234.17      0    32099  133.80  234.16      0
  8589934592    2147483648     float     sum      -1    63929  134.37  235.14      0    63911  134.40  235.21      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 81.112 
#
"""

TWO_MACHINES = """\
Warning: Permanently added '[inst-6ejzf-comp]:12345,[10.0.2.214]:12345' (ECDSA) to the list of known hosts.
# nThread 1 nGpus 1 minBytes 64 maxBytes 10737418240 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1411 on inst-ks8ls-comp device  0 [0x0f] NVIDIA A100-SXM4-40GB
#  Rank  1 Group  0 Pid   1412 on inst-ks8ls-comp device  1 [0x15] NVIDIA A100-SXM4-40GB
#  Rank  2 Group  0 Pid   1413 on inst-ks8ls-comp device  2 [0x51] NVIDIA A100-SXM4-40GB
#  Rank  3 Group  0 Pid   1414 on inst-ks8ls-comp device  3 [0x54] NVIDIA A100-SXM4-40GB
#  Rank  4 Group  0 Pid   1415 on inst-ks8ls-comp device  4 [0x8d] NVIDIA A100-SXM4-40GB
#  Rank  5 Group  0 Pid   1416 on inst-ks8ls-comp device  5 [0x92] NVIDIA A100-SXM4-40GB
#  Rank  6 Group  0 Pid   1419 on inst-ks8ls-comp device  6 [0xd6] NVIDIA A100-SXM4-40GB
#  Rank  7 Group  0 Pid   1422 on inst-ks8ls-comp device  7 [0xda] NVIDIA A100-SXM4-40GB
#  Rank  8 Group  0 Pid   1376 on inst-6ejzf-comp device  0 [0x0f] NVIDIA A100-SXM4-40GB
#  Rank  9 Group  0 Pid   1377 on inst-6ejzf-comp device  1 [0x15] NVIDIA A100-SXM4-40GB
#  Rank 10 Group  0 Pid   1378 on inst-6ejzf-comp device  2 [0x51] NVIDIA A100-SXM4-40GB
#  Rank 11 Group  0 Pid   1379 on inst-6ejzf-comp device  3 [0x54] NVIDIA A100-SXM4-40GB
#  Rank 12 Group  0 Pid   1380 on inst-6ejzf-comp device  4 [0x8d] NVIDIA A100-SXM4-40GB
#  Rank 13 Group  0 Pid   1381 on inst-6ejzf-comp device  5 [0x92] NVIDIA A100-SXM4-40GB
#  Rank 14 Group  0 Pid   1383 on inst-6ejzf-comp device  6 [0xd6] NVIDIA A100-SXM4-40GB
#  Rank 15 Group  0 Pid   1385 on inst-6ejzf-comp device  7 [0xda] NVIDIA A100-SXM4-40GB
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
          64            16     float     sum      -1    38.75    0.00    0.00      0    38.62    0.00    0.00      0
         128            32     float     sum      -1    39.25    0.00    0.01      0    38.13    0.00    0.01      0
         256            64     float     sum      -1    37.80    0.01    0.01      0    37.51    0.01    0.01      0
         512           128     float     sum      -1    37.57    0.01    0.03      0    36.87    0.01    0.03      0
        1024           256     float     sum      -1    39.63    0.03    0.05      0    37.86    0.03    0.05      0
        2048           512     float     sum      -1    41.14    0.05    0.09      0    40.55    0.05    0.09      0
        4096          1024     float     sum      -1    45.04    0.09    0.17      0    44.43    0.09    0.17      0
        8192          2048     float     sum      -1    49.39    0.17    0.31      0    48.33    0.17    0.32      0
       16384          4096     float     sum      -1    52.35    0.31    0.59      0    50.34    0.33    0.61      0
       32768          8192     float     sum      -1    58.75    0.56    1.05      0    57.48    0.57    1.07      0
       65536         16384     float     sum      -1    71.91    0.91    1.71      0    70.11    0.93    1.75      0
      131072         32768     float     sum      -1    103.7    1.26    2.37      0    102.9    1.27    2.39      0
      262144         65536     float     sum      -1    114.0    2.30    4.31      0    115.0    2.28    4.28      0
      524288        131072     float     sum      -1    120.7    4.34    8.14      0    121.1    4.33    8.11      0
     1048576        262144     float     sum      -1    136.1    7.71   14.45      0    139.3    7.53   14.12      0
     2097152        524288     float     sum      -1    169.2   12.40   23.24      0    167.1   12.55   23.53      0
     4194304       1048576     float     sum      -1    233.4   17.97   33.69      0    231.4   18.12   33.98      0
     8388608       2097152     float     sum      -1    358.2   23.42   43.91      0    358.4   23.41   43.89      0
    16777216       4194304     float     sum      -1    941.7   17.82   33.41      0    947.3   17.71   33.21      0
    33554432       8388608     float     sum      -1   1079.0   31.10   58.31      0   1096.3   30.61   57.39      0
    67108864      16777216     float     sum      -1   6058.5   11.08   20.77      0   3709.5   18.09   33.92      0
   134217728      33554432     float     sum      -1   7234.1   18.55   34.79      0   7229.2   18.57   34.81      0
   268435456      67108864     float     sum      -1    13675   19.63   36.81      0    13532   19.84   37.20      0
   536870912     134217728     float     sum      -1    14463   37.12   69.60      0    14467   37.11   69.58      0
  1073741824     268435456     float     sum      -1    28656   37.47   70.26      0    28667   37.46   70.23      0
  2147483648     536870912     float     sum      -1    56697   37.88   71.02      0    56712   37.87   71.00      0
  4294967296    1073741824     float     sum      -1   112804   38.07   71.39      0   112801   38.08   71.39      0
  8589934592    2147483648     float     sum      -1   225083   38.16   71.56      0   225082   38.16   71.56      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 24.2272 
#
"""

# name -> (log, GPUs taking part): what a reader of each log should find.
ALL_REDUCE_PERF_LOGS = {"one machine, 8 GPUs": (ONE_MACHINE, 8), "two machines, 16 GPUs": (TWO_MACHINES, 16)}

OLDER_LAYOUT = """\
Running: CUDA_VISIBLE_DEVICES=1,2,6,7,8,9,10,11,12,13,14,15 LD_PRELOAD=/home/jgwohlbier/nccl/build/lib/libnccl.so.2 ./build/all_reduce_perf -b 8 -e 10240M -f 2 -g 12
# nThread 1 nGpus 12 minBytes 8 maxBytes 10737418240 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  88131 on    seville device  0 [0x36] Tesla V100-SXM3-32GB
#   Rank  1 Pid  88131 on    seville device  1 [0x39] Tesla V100-SXM3-32GB
#   Rank  2 Pid  88131 on    seville device  2 [0x5c] Tesla V100-SXM3-32GB
#   Rank  3 Pid  88131 on    seville device  3 [0x5e] Tesla V100-SXM3-32GB
#   Rank  4 Pid  88131 on    seville device  4 [0xb7] Tesla V100-SXM3-32GB
#   Rank  5 Pid  88131 on    seville device  5 [0xb9] Tesla V100-SXM3-32GB
#   Rank  6 Pid  88131 on    seville device  6 [0xbc] Tesla V100-SXM3-32GB
#   Rank  7 Pid  88131 on    seville device  7 [0xbe] Tesla V100-SXM3-32GB
#   Rank  8 Pid  88131 on    seville device  8 [0xe0] Tesla V100-SXM3-32GB
#   Rank  9 Pid  88131 on    seville device  9 [0xe2] Tesla V100-SXM3-32GB
#   Rank 10 Pid  88131 on    seville device 10 [0xe5] Tesla V100-SXM3-32GB
#   Rank 11 Pid  88131 on    seville device 11 [0xe7] Tesla V100-SXM3-32GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    61.03    0.00    0.00  2e-07    61.04    0.00    0.00  1e-07
          16             4   float     sum    60.87    0.00    0.00  1e-07    60.37    0.00    0.00  1e-07
          32             8   float     sum    60.86    0.00    0.00  1e-07    60.99    0.00    0.00  6e-08
          64            16   float     sum    60.26    0.00    0.00  6e-08    60.69    0.00    0.00  6e-08
         128            32   float     sum    60.60    0.00    0.00  6e-08    61.52    0.00    0.00  6e-08
         256            64   float     sum    60.70    0.00    0.01  6e-08    61.41    0.00    0.01  6e-08
         512           128   float     sum    61.53    0.01    0.02  6e-08    60.30    0.01    0.02  6e-08
        1024           256   float     sum    60.93    0.02    0.03  2e-07    60.42    0.02    0.03  2e-07
        2048           512   float     sum    61.25    0.03    0.06  2e-07    61.26    0.03    0.06  2e-07
        4096          1024   float     sum    62.86    0.07    0.12  2e-07    62.83    0.07    0.12  2e-07
        8192          2048   float     sum    62.42    0.13    0.24  2e-07    63.50    0.13    0.24  2e-07
       16384          4096   float     sum    64.46    0.25    0.47  2e-07    61.31    0.27    0.49  2e-07
       32768          8192   float     sum    63.44    0.52    0.95  2e-07    63.68    0.51    0.94  2e-07
       65536         16384   float     sum    65.05    1.01    1.85  2e-07    65.13    1.01    1.84  2e-07
      131072         32768   float     sum    65.86    1.99    3.65  2e-07    64.75    2.02    3.71  2e-07
      262144         65536   float     sum    68.35    3.84    7.03  2e-07    68.60    3.82    7.01  2e-07
      524288        131072   float     sum    75.87    6.91   12.67  2e-07    75.52    6.94   12.73  2e-07
     1048576        262144   float     sum    89.15   11.76   21.56  2e-07    88.14   11.90   21.81  2e-07
     2097152        524288   float     sum    143.5   14.62   26.80  2e-07    144.7   14.50   26.58  2e-07
     4194304       1048576   float     sum    183.7   22.84   41.87  2e-07    184.0   22.79   41.78  2e-07
     8388608       2097152   float     sum    283.5   29.59   54.25  2e-07    282.9   29.65   54.36  2e-07
    16777216       4194304   float     sum    482.8   34.75   63.71  2e-07    487.1   34.45   63.15  2e-07
    33554432       8388608   float     sum    565.7   59.32  108.75  2e-07    563.6   59.53  109.15  2e-07
    67108864      16777216   float     sum   1051.8   63.80  116.98  2e-07   1052.0   63.79  116.96  2e-07
   134217728      33554432   float     sum   2047.7   65.54  120.17  2e-07   2046.4   65.59  120.24  2e-07
   268435456      67108864   float     sum   4036.6   66.50  121.92  2e-07   4036.7   66.50  121.91  2e-07
   536870912     134217728   float     sum   8021.5   66.93  122.70  2e-07   8022.0   66.92  122.69  2e-07
  1073741824     268435456   float     sum    15986   67.17  123.14  2e-07    15989   67.15  123.12  2e-07
  2147483648     536870912   float     sum    31928   67.26  123.31  2e-07    31938   67.24  123.27  2e-07
  4294967296    1073741824   float     sum    63758   67.36  123.50  2e-07    63766   67.36  123.49  2e-07
  8589934592    2147483648   float     sum   127453   67.40  123.56  2e-07   127443   67.40  123.57  2e-07
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 42.5578
#
"""

# The older layout, kept apart from ALL_REDUCE_PERF_LOGS: name -> (log, GPUs taking part).
OLDER_LAYOUT_LOGS = {"DGX-2, 12 GPUs, older nccl-tests (no root column)": (OLDER_LAYOUT, 12)}
