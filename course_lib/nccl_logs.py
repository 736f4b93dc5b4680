"""Two real outputs of nccl-tests' all_reduce_perf, for notebook 04 (section 6) and exercise 04.

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
"""

__all__ = ["ONE_MACHINE", "TWO_MACHINES", "ALL_REDUCE_PERF_LOGS"]

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
