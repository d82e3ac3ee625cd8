"""Sel-CL / Sel-CL+ (Li et al., CVPR 2022): a faithful, fast reimplementation.

One module per concern:
  data       datasets as uint8 arrays (digits, CIFAR-10/100, imagefolder)
  noise      synthetic / file noisy labels, transition matrix          (SPEC §1)
  models     PreAct ResNet-18, ResNet-18 (224 px), small CPU net, EMA   (SPEC §2)
  augment    batched tensor augmentation on the data's device           (SPEC §3)
  knn        faiss / torch k-nearest-neighbour search, self excluded    (SPEC §5.1)
  selection  confident examples T and pairs G                           (SPEC §5)
  losses     MoCo, selective SupCon, L_CLS, L_SIM, bootstrapping        (SPEC §4, §6, §7)
  memory     key queue and labelled EMA memory                          (SPEC §4, §6)
  train      warm-up, pre-training, fine-tuning, CE baseline loops       (SPEC §4, §6, §7)
  evaluate   weighted k-NN evaluation                                   (SPEC §8)
  device     the one place that knows about CUDA
"""

__version__ = "0.1.0"
