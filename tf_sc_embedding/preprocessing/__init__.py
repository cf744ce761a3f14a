"""Host preprocessing of a batch before its lookup: ids to COO to minibatch splits to CSR buffers
(`enqueue`), the partition statistics of the batches (`stats`) and the partition limits raised
online from them (`online_limits`)."""
