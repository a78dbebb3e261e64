"""Convolutional networks in plain torch.nn: ResNet-18/50, VGG-16 and tiny test variants.

Module names follow torchvision (conv1, bn1, layer1.0.conv1, layer1.0.downsample.0, fc,
features.0, classifier.0) so a plan keyed by FQN carries over to torchvision weights. One
difference: each ReLU call has its own module (relu1, relu2, ...), so every op has its own FQN.
Parameter counts equal torchvision's (resnet18 11,689,512; resnet50 25,557,032;
vgg16 138,357,544).
"""

from __future__ import annotations

from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU()
        self.downsample = downsample

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu2(out + identity)


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck: the stride sits on the 3x3 conv."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu3 = nn.ReLU()
        self.downsample = downsample

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(out + identity)


class ResNet(nn.Module):
    """ImageNet stem (7x7/2 conv + max-pool) or CIFAR stem (3x3/1 conv, no pool) + 4 stages."""

    def __init__(self, block, layers, widths=(64, 128, 256, 512), num_classes=1000, stem="imagenet"):
        super().__init__()
        self.inplanes = widths[0]
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        else:
            self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1) if stem == "imagenet" else nn.Identity()
        for i, (w, n) in enumerate(zip(widths, layers)):
            setattr(self, f"layer{i + 1}", self._stage(block, w, n, 1 if i == 0 else 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten(1)
        self.fc = nn.Linear(widths[-1] * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _stage(self, block, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        out = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        out += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*out)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.flatten(self.avgpool(x)))


class VGG(nn.Module):
    """torchvision VGG without batch norm: conv stack, 7x7 adaptive pool, 3 linear layers."""

    def __init__(self, cfg, num_classes=1000, dropout=0.5):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU()]
                cin = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.flatten = nn.Flatten(1)
        self.classifier = nn.Sequential(
            nn.Linear(cin * 49, 4096), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.flatten(self.avgpool(self.features(x))))


VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class TinyCNN(nn.Module):
    """MNIST-1D-sized classifier: 3 Conv1d (stride 2) + 1 Linear on (B, 1, 40) signals, 10 classes.

    Chosen 1-D so the test suite exercises the conv1d kind; it trains in seconds on a CPU.
    """

    def __init__(self, num_classes: int = 10, channels: int = 32, length: int = 40):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, 2, 2)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv1d(channels, channels, 5, 2, 2)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv1d(channels, channels, 5, 2, 2)
        self.relu3 = nn.ReLU()
        self.flatten = nn.Flatten(1)
        out_len = length
        for _ in range(3):
            out_len = (out_len + 2 * 2 - 5) // 2 + 1
        self.fc = nn.Linear(channels * out_len, num_classes)

    def forward(self, x):
        x = self.relu1(self.conv1(x))
        x = self.relu2(self.conv2(x))
        x = self.relu3(self.conv3(x))
        return self.fc(self.flatten(x))


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes=num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes=num_classes)


def tiny_resnet(num_classes: int = 10) -> ResNet:
    """CIFAR-sized (32x32) ResNet: one BasicBlock per stage, widths 8-64 (about 0.2M params)."""
    return ResNet(BasicBlock, (1, 1, 1, 1), widths=(8, 16, 32, 64), num_classes=num_classes, stem="cifar")


def vgg16(num_classes: int = 1000, dropout: float = 0.5) -> VGG:
    return VGG(VGG16_CFG, num_classes=num_classes, dropout=dropout)


def tiny_cnn(num_classes: int = 10, channels: int = 32, length: int = 40) -> TinyCNN:
    return TinyCNN(num_classes=num_classes, channels=channels, length=length)
