// RUN: phaze-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Verifier errors carry MLIR-style messages naming the op.

builtin.module {
  func.func @f(%a: tensor<8x64xf16>, %b: tensor<32x16xf16>) {
    %y = phaze.matmul %a, %b : (tensor<8x64xf16>, tensor<32x16xf16>) -> tensor<8x16xf16>
    func.return
  }
}
// CHECK: 'phaze.matmul' op contracting dimensions differ: lhs has K = 64, rhs has K = 32

// -----

builtin.module {
  func.func @f(%a: tensor<8x64xf16>, %b: tensor<64x16xf16>) {
    %y = phaze.matmul %a, %b : (tensor<8x64xf16>, tensor<64x16xf16>) -> tensor<8x32xf16>
    func.return
  }
}
// CHECK: 'phaze.matmul' op result shape (8, 32) does not match expected (8, 16)

// -----

builtin.module {
  func.func @f(%a: tensor<8x64xf16>) {
    %y = phaze.elementwise "frobnicate" %a aten "aten.x" : (tensor<8x64xf16>) -> tensor<8x64xf16>
    func.return
  }
}
// CHECK: 'phaze.elementwise' op has unknown kind "frobnicate"; expected one of

// -----

builtin.module {
  func.func @f(%a: tensor<8x64xf16>) {
    %y = phaze.softmax "softmax" %a dim 2 : (tensor<8x64xf16>) -> tensor<8x64xf16>
    func.return
  }
}
// CHECK: 'phaze.softmax' op dim 2 is out of range for rank 2

// -----

builtin.module {
  func.func @f(%w: tensor<8x64xf16>, %g: tensor<8x64xf32>) {
    %u = phaze.optimizer_update "adam" %w, %g state_bytes 12 : (tensor<8x64xf16>, tensor<8x64xf32>) -> tensor<8x64xf16>
    func.return
  }
}
// CHECK: 'phaze.optimizer_update' op gradient type tensor<8x64xf32> differs from parameter type tensor<8x64xf16>
