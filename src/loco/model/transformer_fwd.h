// The transformer's names without its definition (model/transformer.h), for headers that take the
// model by reference or pointer: a translation unit that includes this alone needs none of torch::nn
// and so gets the light precompiled header (cmake/torch_pch.cmake).
#pragma once

namespace loco::model {

class TransformerImpl;
class Transformer;  // TORCH_MODULE(Transformer): a torch::nn::ModuleHolder<TransformerImpl>
struct ParameterGroup;
struct LossParts;

}  // namespace loco::model
