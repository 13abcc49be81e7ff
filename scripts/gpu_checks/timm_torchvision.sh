# shellcheck shell=bash
# model=timm on a GPU (feature timm_torchvision): a timm ResNet-18 in bf16 and channels_last, sourced by
# scripts/gpu_check.sh (its `check`, $out, $status); deleting the feature deletes this file (docs/features.md).
check timm_resnet18_digits finetune.input_size=64 model=timm model.name=resnet18 precision=bf16 trainer.channels_last=true trainer.max_epochs=2
