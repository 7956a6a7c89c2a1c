# /etc/profile.d script for colossus-200k GPU nodes: rendered by gpucluster.
export NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
export NCCL_SOCKET_IFNAME=eth0
export NCCL_IB_GID_INDEX=3
export NCCL_IB_TC=104
export NCCL_IB_QPS_PER_CONNECTION=4
export NCCL_CROSS_NIC=0
export CUDA_DEVICE_ORDER=PCI_BUS_ID
