# /etc/profile.d script for staging GPU nodes: rendered by gpucluster.
export NCCL_IB_HCA==veth0
export NCCL_SOCKET_IFNAME=eth0
export NCCL_IB_GID_INDEX=3
export NCCL_IB_TC=104
export NCCL_IB_QPS_PER_CONNECTION=1
export NCCL_CROSS_NIC=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID
