from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rm_qdrant_train.backbones import ARCHS, Backbone, build_backbone

NUM_CLASSES, EMBED_DIM = 7, 16

# (arch, stem, image size, width of the pooled trunk features)
CASES = [
    ("small-cnn", "cifar", 32, 256),
    ("small-cnn", "imagenet", 64, 256),
    ("resnet18", "cifar", 32, 512),
    ("resnet18", "imagenet", 64, 512),
    ("resnet50", "cifar", 32, 2048),
    ("resnet50", "imagenet", 64, 2048),
    ("vit-b32", "cifar", 64, 768),
]


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def test_cases_cover_every_arch():
    assert {case[0] for case in CASES} == set(ARCHS)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "stem", "size", "feature_dim"), CASES, ids=[f"{a}-{s}" for a, s, *_ in CASES]
)
def test_shapes_and_logits_come_from_the_embedding(arch, stem, size, feature_dim):
    model = build_backbone(arch, num_classes=NUM_CLASSES, embed_dim=EMBED_DIM, stem=stem, image_size=size)
    assert isinstance(model, Backbone)
    assert (model.arch, model.embed_dim, model.num_classes, model.feature_dim) == (
        arch,
        EMBED_DIM,
        NUM_CLASSES,
        feature_dim,
    )
    x = torch.randn(2, 3, size, size)
    model.eval()
    with torch.no_grad():
        features = model.features(x)
        embedding, logits = model(x)
        assert features.shape == (2, feature_dim)
        assert embedding.shape == (2, EMBED_DIM)
        assert logits.shape == (2, NUM_CLASSES)
        assert torch.isfinite(embedding).all() and torch.isfinite(logits).all()
        torch.testing.assert_close(model.classifier(embedding), logits)
        torch.testing.assert_close(model.embed(features), embedding)


def test_one_models_classifier_scores_another_models_embeddings():
    old = build_backbone("small-cnn", num_classes=NUM_CLASSES, embed_dim=EMBED_DIM)
    new = build_backbone("resnet18", num_classes=NUM_CLASSES, embed_dim=EMBED_DIM)
    embedding, _ = new(torch.randn(2, 3, 32, 32))
    influence = F.cross_entropy(old.classifier(embedding), torch.tensor([0, 1]))
    influence.backward()
    assert all(p.grad is not None for p in new.trunk.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["small-cnn", "resnet18"])
def test_a_few_sgd_steps_lower_the_loss_on_a_fixed_batch(arch):
    model = build_backbone(arch, num_classes=4, embed_dim=EMBED_DIM)
    # 16x16 keeps the test fast; the trunks pool globally, so any size of at least 16 works.
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8) % 4
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x)[1], y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # Every parameter must be on the path to the logits, or it would never train.
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert losses[-1] < 0.5 * losses[0], losses


def test_vit_position_embeddings_follow_the_image_size():
    model = build_backbone("vit-b32", num_classes=NUM_CLASSES, image_size=96)
    assert model.pos_embed.shape == (1, 1 + 3 * 3, 768)
    assert len(model.blocks) == 12
    with pytest.raises(ValueError, match="96x96"):
        model(torch.randn(1, 3, 64, 64))


@pytest.mark.parametrize("size", [48, 0, 31])
def test_vit_rejects_sizes_not_divisible_by_the_patch(size):
    with pytest.raises(ValueError, match="divisible by 32"):
        build_backbone("vit-b32", num_classes=NUM_CLASSES, image_size=size)


def test_unknown_arch_names_the_valid_ones():
    with pytest.raises(ValueError, match="resnet18") as raised:
        build_backbone("resnet34", num_classes=NUM_CLASSES)
    assert all(arch in str(raised.value) for arch in ARCHS)


def test_unknown_stem_names_the_valid_ones():
    with pytest.raises(ValueError, match="cifar, imagenet"):
        build_backbone("resnet18", num_classes=NUM_CLASSES, stem="tiny")
