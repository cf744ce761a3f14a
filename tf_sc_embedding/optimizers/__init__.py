"""The fused optimizers: TensorFlow's optimizer configs bound to the C++ optimizers with their
slots (`configs`), the row-wise Adagrad config TensorFlow lacks (`row_wise_adagrad`), and one fused
update of one stacked table, its inputs and how it runs (`fused_update`)."""
