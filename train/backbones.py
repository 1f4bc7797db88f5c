"""Image backbones that return an embedding and the logits computed from it.

Every model maps normalised float images (N, 3, H, W) to ``(embedding, logits)``: the
embedding is a Linear projection of the trunk's pooled features, and the logits are
``classifier(embedding)``. Because the classifier only sees the embedding, one model's
classifier can score another model's embeddings, which BCT's influence loss needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ARCHS = ("small-cnn", "resnet18", "resnet50", "vit-b32")
STEMS = ("cifar", "imagenet")


class Backbone(nn.Module):
    """Base class: a trunk (``features``), a Linear embedding and a Linear classifier on it.

    Attributes:
        arch: One of ``ARCHS``.
        feature_dim: Width of the trunk's pooled features.
        embed_dim: Width of the embedding (not L2-normalised).
        num_classes: Number of logits.
        embed: Linear(feature_dim, embed_dim).
        classifier: Linear(embed_dim, num_classes).
    """

    def __init__(self, arch: str, feature_dim: int, *, num_classes: int, embed_dim: int) -> None:
        super().__init__()
        self.arch = arch
        self.feature_dim = feature_dim
        self.embed_dim = embed_dim
        self.num_classes = num_classes
        self.embed = nn.Linear(feature_dim, embed_dim)
        self.classifier = nn.Linear(embed_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Pooled trunk features (N, feature_dim) of normalised images (N, 3, H, W)."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(embedding, logits)`` of shapes (N, embed_dim) and (N, num_classes)."""
        embedding = self.embed(self.features(x))
        return embedding, self.classifier(embedding)


def _conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


def _imagenet_stem(width: int) -> list[nn.Module]:
    """7x7 stride-2 conv and a 3x3 stride-2 max-pool: a quarter of the resolution."""
    return [*_conv_bn(3, width, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]


def _init_conv_nets(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


# --- small CNN -------------------------------------------------------------------------------------


class _Residual(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


def _conv_pool(cin: int, cout: int) -> list[nn.Module]:
    # Pooling before BN and ReLU, as in the fast CIFAR designs: the normalisation and
    # activation then run on a quarter of the pixels, which on a CPU is a large part of the time.
    return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.MaxPool2d(2), nn.BatchNorm2d(cout), nn.ReLU(True)]


class SmallCNN(Backbone):
    """Four conv stages 64-128-256-256 (≈58 M multiply-adds per 32x32 image), for CPU training.

    32x32: conv 3→64, pool (16x16); conv 64→128, pool (8x8); conv 128→256, pool (4x4);
    a residual pair of 256→256 convs at 4x4; global average pooling. Every conv is 3x3 with
    BatchNorm and ReLU. ``stem="imagenet"`` replaces the first conv and pool by the ResNet stem.
    """

    def __init__(self, *, num_classes: int, embed_dim: int, stem: str) -> None:
        super().__init__("small-cnn", 256, num_classes=num_classes, embed_dim=embed_dim)
        first = _conv_pool(3, 64) if stem == "cifar" else _imagenet_stem(64)
        pair = nn.Sequential(*_conv_bn(256, 256), nn.ReLU(True), *_conv_bn(256, 256), nn.ReLU(True))
        self.trunk = nn.Sequential(
            *first, *_conv_pool(64, 128), *_conv_pool(128, 256), _Residual(pair), nn.AdaptiveAvgPool2d(1)
        )
        _init_conv_nets(self)

    def features(self, x: Tensor) -> Tensor:
        # oneDNN's convolutions are ~1.5x faster on channels-last tensors on a CPU, and the
        # layout then propagates through the trunk; converting the input is cheap.
        return self.trunk(x.contiguous(memory_format=torch.channels_last)).flatten(1)


# --- ResNets ---------------------------------------------------------------------------------------


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(cin, width, 3, stride), nn.ReLU(True), *_conv_bn(width, width))
        self.shortcut = _shortcut(cin, width, stride)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        # Stride on the 3x3 conv (ResNet v1.5), as torchvision does: more accurate than on the 1x1.
        self.body = nn.Sequential(
            *_conv_bn(cin, width, 1),
            nn.ReLU(True),
            *_conv_bn(width, width, 3, stride),
            nn.ReLU(True),
            *_conv_bn(width, cout, 1),
        )
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class ResNet(Backbone):
    """ResNet-18 (BasicBlock) or ResNet-50 (Bottleneck) with a CIFAR or ImageNet stem.

    The CIFAR stem is a 3x3 stride-1 conv without max-pool, so 32x32 images reach the last
    stage at 4x4; the ImageNet stem is the usual 7x7 stride-2 conv and 3x3 max-pool.
    """

    def __init__(self, arch: str, *, num_classes: int, embed_dim: int, stem: str) -> None:
        block, depths = (_BasicBlock, (2, 2, 2, 2)) if arch == "resnet18" else (_Bottleneck, (3, 4, 6, 3))
        super().__init__(arch, 512 * block.expansion, num_classes=num_classes, embed_dim=embed_dim)
        layers = [*_conv_bn(3, 64), nn.ReLU(True)] if stem == "cifar" else _imagenet_stem(64)
        cin = 64
        for stage, depth in enumerate(depths):
            width = 64 * 2**stage
            for i in range(depth):
                layers.append(block(cin, width, 2 if stage > 0 and i == 0 else 1))
                cin = width * block.expansion
        self.trunk = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1))
        _init_conv_nets(self)

    def features(self, x: Tensor) -> Tensor:
        return self.trunk(x).flatten(1)


# --- ViT -------------------------------------------------------------------------------------------


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        # unbind rather than tuple-unpacking, which an ONNX trace records as a fixed-length loop.
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


class _Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(Backbone):
    """ViT-B/32: 32x32 patches, width 768, 12 blocks of 12 heads, MLP 3072; the class token's output."""

    def __init__(
        self,
        *,
        num_classes: int,
        embed_dim: int,
        image_size: int,
        patch: int = 32,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        mlp_dim: int = 3072,
    ) -> None:
        super().__init__("vit-b32", dim, num_classes=num_classes, embed_dim=embed_dim)
        if image_size <= 0 or image_size % patch:
            raise ValueError(f"vit-b32 needs an image size divisible by {patch}, got {image_size}")
        self.image_size = image_size
        self.patchify = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + (image_size // patch) ** 2, dim))
        self.blocks = nn.Sequential(*(_Block(dim, heads, mlp_dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self._init()

    def _init(self) -> None:
        # The usual ViT recipe: small truncated-normal embeddings and Xavier Linear layers.
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.blocks.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: Tensor) -> Tensor:
        # The check is skipped while tracing (ONNX export), where it would only be a constant.
        if not torch.jit.is_tracing() and x.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"vit-b32 was built for {self.image_size}x{self.image_size} images, got {x.shape}"
            )
        tokens = self.patchify(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos_embed
        return self.norm(self.blocks(tokens))[:, 0]


def build_backbone(
    arch: str, *, num_classes: int, embed_dim: int = 128, stem: str = "cifar", image_size: int = 32
) -> Backbone:
    """Build a randomly initialised backbone.

    Args:
        arch: One of ``ARCHS``.
        num_classes: Number of logits.
        embed_dim: Width of the embedding.
        stem: ``"cifar"`` (full resolution, for 32x32) or ``"imagenet"`` (7x7 stride-2 conv
            and max-pool); used by the CNNs, checked but ignored by ``vit-b32``.
        image_size: Side of the square input; only ``vit-b32`` needs it (position embeddings),
            and it must be divisible by 32 there.

    Raises:
        ValueError: Unknown ``arch`` or ``stem``, or an image size that ViT-B/32 cannot patch.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}; choose one of {', '.join(STEMS)}")
    if arch == "small-cnn":
        return SmallCNN(num_classes=num_classes, embed_dim=embed_dim, stem=stem)
    if arch == "vit-b32":
        return ViT(num_classes=num_classes, embed_dim=embed_dim, image_size=image_size)
    return ResNet(arch, num_classes=num_classes, embed_dim=embed_dim, stem=stem)
