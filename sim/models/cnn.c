/* cnn.c — convolutional networks for image classification: AlexNet, VGG-16, ResNet-50,
 * -101 and -152, ResNeXt-50 (32x4d) and Inception-v3.
 *
 * Every network follows its definition in the torchvision.models package, layer for
 * layer and with torchvision's operator names, because torchvision's parameter counts
 * and multiply-accumulate counts are the figures papers and model cards quote:
 * FlexFlow (MLSys'19) evaluates AlexNet, ResNet-101 and Inception-v3, Unity (OSDI'22)
 * ResNeXt-50 and Inception-v3, OptCNN (ICML'18) AlexNet, VGG-16 and Inception-v3.
 * Convolutions are NCHW; batch normalization has a scale and a shift per channel (its
 * running statistics are buffers, not parameters). */
#include "zoo.h"

#include <string.h>

static SimConvParams conv_params(int64_t cout, int kh, int kw, int sh, int sw, int ph, int pw)
{
  SimConvParams p = sim_conv_params(cout, kh, kw);
  p.stride[0] = sh;
  p.stride[1] = sw;
  p.padding[0] = ph;
  p.padding[1] = pw;
  return p;
}

static int images_input(SimGraph *g, int64_t batch, int64_t image)
{
  int64_t dims[] = { batch, 3, image, image };
  return sim_graph_input(g, "images", SIM_DTYPE_FP32, 4, dims);
}

/* Flattens the [n, c, h, w] features into [n, c*h*w] for the classifier. */
static int flatten(SimGraph *g, int x, int64_t batch)
{
  int64_t dims[] = { batch, -1 };
  return sim_graph_reshape(g, "flatten", x, 2, dims);
}

/* Global average pooling over whatever spatial size the features have left. */
static int global_avgpool(SimGraph *g, int x)
{
  SimShape s = sim_zoo_shape(g, x);
  int kh = s.ndim == 4 ? (int)s.dims[2] : 1, kw = s.ndim == 4 ? (int)s.dims[3] : 1;
  return sim_graph_pool2d(g, "avgpool", x, SIM_POOL_AVG, kh, kw, kh, kw, 0, 0);
}

static void classification_loss(SimGraph *g, int logits, int64_t batch)
{
  int64_t dims[] = { batch };
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT32, 1, dims);
  sim_graph_cross_entropy(g, "loss", logits, labels);
}

/* ---------------------------------------------------------------------------------- */
/* AlexNet (Krizhevsky et al. 2012, torchvision's single-tower variant: 61.1 M params)  */

static SimGraph *build_alexnet(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  int x = images_input(g, batch, sim_zoo_arg(a, "image"));

  /* features: (out channels, kernel, stride, padding, max-pool after) */
  static const struct { int cout, k, s, p; gboolean pool; } convs[] = {
    { 64, 11, 4, 2, TRUE }, { 192, 5, 1, 2, TRUE }, { 384, 3, 1, 1, FALSE },
    { 256, 3, 1, 1, FALSE }, { 256, 3, 1, 1, TRUE },
  };
  SimZooName n;
  int pools = 0;
  for (size_t i = 0; i < G_N_ELEMENTS(convs); i++) {
    SimConvParams p = conv_params(convs[i].cout, convs[i].k, convs[i].k, convs[i].s,
                                  convs[i].s, convs[i].p, convs[i].p);
    p.bias = TRUE;
    p.activation = SIM_UNARY_RELU;
    x = sim_graph_conv2d(g, sim_zoo_name(&n, "conv%zu", i + 1), x, &p);
    if (convs[i].pool)
      x = sim_graph_pool2d(g, sim_zoo_name(&n, "pool%d", ++pools), x, SIM_POOL_MAX, 3, 3, 2,
                           2, 0, 0);
  }
  /* At 224x224 the features are 256x6x6, which torchvision's adaptive pooling keeps
   * as they are; the classifier's input follows the image size otherwise. */
  x = flatten(g, x, batch);
  x = sim_graph_dropout(g, "dropout6", x, 0.5);
  x = sim_graph_linear(g, "fc6", x, 4096, TRUE, SIM_UNARY_RELU);
  x = sim_graph_dropout(g, "dropout7", x, 0.5);
  x = sim_graph_linear(g, "fc7", x, 4096, TRUE, SIM_UNARY_RELU);
  x = sim_graph_linear(g, "fc8", x, sim_zoo_arg(a, "classes"), TRUE, SIM_UNARY_IDENTITY);
  classification_loss(g, x, batch);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* VGG-16 (Simonyan and Zisserman 2015, configuration D: 138.4 M params, 15.5 GMACs)    */

static SimGraph *build_vgg16(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  int x = images_input(g, batch, sim_zoo_arg(a, "image"));

  /* Configuration D: the widths of the 3x3 convolutions, 0 for a 2x2 max-pool. */
  static const int cfg[] = { 64, 64, 0, 128, 128, 0, 256, 256, 256, 0,
                             512, 512, 512, 0, 512, 512, 512, 0 };
  SimZooName n;
  int block = 1, conv = 1;
  for (size_t i = 0; i < G_N_ELEMENTS(cfg); i++) {
    if (cfg[i] == 0) {
      x = sim_graph_pool2d(g, sim_zoo_name(&n, "pool%d", block), x, SIM_POOL_MAX, 2, 2, 2, 2,
                           0, 0);
      block++;
      conv = 1;
      continue;
    }
    SimConvParams p = conv_params(cfg[i], 3, 3, 1, 1, 1, 1);
    p.bias = TRUE;
    p.activation = SIM_UNARY_RELU;
    x = sim_graph_conv2d(g, sim_zoo_name(&n, "conv%d_%d", block, conv++), x, &p);
  }
  x = flatten(g, x, batch);
  x = sim_graph_linear(g, "fc6", x, 4096, TRUE, SIM_UNARY_RELU);
  x = sim_graph_dropout(g, "dropout6", x, 0.5);
  x = sim_graph_linear(g, "fc7", x, 4096, TRUE, SIM_UNARY_RELU);
  x = sim_graph_dropout(g, "dropout7", x, 0.5);
  x = sim_graph_linear(g, "fc8", x, sim_zoo_arg(a, "classes"), TRUE, SIM_UNARY_IDENTITY);
  classification_loss(g, x, batch);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* ResNet (He et al. 2016) and ResNeXt (Xie et al. 2017), bottleneck blocks            */

/* Convolution without bias followed by batch normalization, optionally ReLU. */
static int conv_bn(SimGraph *g, const char *prefix, const char *conv, const char *bn, int x,
                   const SimConvParams *p, gboolean relu)
{
  SimZooName n;
  x = sim_graph_conv2d(g, sim_zoo_name(&n, "%s%s", prefix, conv), x, p);
  return sim_graph_batchnorm(g, sim_zoo_name(&n, "%s%s", prefix, bn), x, relu);
}

/* torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3x3 convolution).
 * @width is the bottleneck's inner width, @groups its cardinality. */
static int bottleneck(SimGraph *g, const char *prefix, int x, int64_t in, int64_t width,
                      int64_t out, int stride, int groups)
{
  SimConvParams p1 = conv_params(width, 1, 1, 1, 1, 0, 0);
  SimConvParams p2 = conv_params(width, 3, 3, stride, stride, 1, 1);
  p2.groups = groups;
  SimConvParams p3 = conv_params(out, 1, 1, 1, 1, 0, 0);
  int y = conv_bn(g, prefix, ".conv1", ".bn1", x, &p1, TRUE);
  y = conv_bn(g, prefix, ".conv2", ".bn2", y, &p2, TRUE);
  y = conv_bn(g, prefix, ".conv3", ".bn3", y, &p3, FALSE);
  int shortcut = x;
  if (stride != 1 || in != out) {
    SimConvParams pd = conv_params(out, 1, 1, stride, stride, 0, 0);
    shortcut = conv_bn(g, prefix, ".downsample.0", ".downsample.1", x, &pd, FALSE);
  }
  SimZooName n;
  y = sim_graph_binary(g, sim_zoo_name(&n, "%s.add", prefix), y, shortcut, SIM_BINARY_ADD);
  return sim_graph_unary(g, sim_zoo_name(&n, "%s.relu", prefix), y, SIM_UNARY_RELU);
}

/* Blocks per stage and the bottleneck shape: ResNet has inner width = planes, ResNeXt
 * 32x4d has 32 groups of 4 channels per 64 planes (inner width = 2 * planes). */
typedef struct {
  int blocks[4];
  int groups;
  int width_per_group;
} ResNetConfig;

static SimGraph *build_resnet_config(const SimZooModel *model, const SimZooArgs *a,
                                     const ResNetConfig *cfg)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  int x = images_input(g, batch, sim_zoo_arg(a, "image"));

  SimConvParams stem = conv_params(64, 7, 7, 2, 2, 3, 3);
  x = sim_graph_conv2d(g, "conv1", x, &stem);
  x = sim_graph_batchnorm(g, "bn1", x, TRUE);
  x = sim_graph_pool2d(g, "maxpool", x, SIM_POOL_MAX, 3, 3, 2, 2, 1, 1);

  int64_t in = 64;
  SimZooName n;
  for (int stage = 0; stage < 4; stage++) {
    int64_t planes = 64 << stage;
    int64_t width = planes * cfg->width_per_group / 64 * cfg->groups;
    for (int b = 0; b < cfg->blocks[stage]; b++) {
      int stride = stage > 0 && b == 0 ? 2 : 1;
      x = bottleneck(g, sim_zoo_name(&n, "layer%d.%d", stage + 1, b), x, in, width,
                     planes * 4, stride, cfg->groups);
      in = planes * 4;
    }
  }
  x = global_avgpool(g, x);
  x = flatten(g, x, batch);
  x = sim_graph_linear(g, "fc", x, sim_zoo_arg(a, "classes"), TRUE, SIM_UNARY_IDENTITY);
  classification_loss(g, x, batch);
  return g_steal_pointer(&g);
}

static SimGraph *build_resnet(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  static const ResNetConfig resnet50 = { { 3, 4, 6, 3 }, 1, 64 };
  static const ResNetConfig resnet101 = { { 3, 4, 23, 3 }, 1, 64 };
  static const ResNetConfig resnet152 = { { 3, 8, 36, 3 }, 1, 64 };
  static const ResNetConfig resnext50 = { { 3, 4, 6, 3 }, 32, 4 };
  static const ResNetConfig resnext101 = { { 3, 4, 23, 3 }, 32, 4 };
  const ResNetConfig *cfg = &resnet50;
  if (!strcmp(model->name, "resnet-101"))
    cfg = &resnet101;
  else if (!strcmp(model->name, "resnet-152"))
    cfg = &resnet152;
  else if (!strcmp(model->name, "resnext-50"))
    cfg = &resnext50;
  else if (!strcmp(model->name, "resnext-101"))
    cfg = &resnext101;
  return build_resnet_config(model, a, cfg);
}

/* ---------------------------------------------------------------------------------- */
/* Inception-v3 (Szegedy et al. 2016), torchvision's inception_v3 without the auxiliary */
/* classifier: 23.8 M params (27.2 M with it), 5.7 GMACs at 299x299                    */

/* torchvision's BasicConv2d: convolution without bias, batch normalization, ReLU. */
static int basic_conv(SimGraph *g, const char *block, const char *name, int x, int64_t cout,
                      int kh, int kw, int stride, int ph, int pw)
{
  SimConvParams p = conv_params(cout, kh, kw, stride, stride, ph, pw);
  SimZooName n;
  x = sim_graph_conv2d(g, sim_zoo_name(&n, "%s%s%s.conv", block, *block ? "." : "", name), x,
                       &p);
  return sim_graph_batchnorm(g, sim_zoo_name(&n, "%s%s%s.bn", block, *block ? "." : "", name),
                             x, TRUE);
}

static int concat_branches(SimGraph *g, const char *block, int n_branches, const int *xs)
{
  SimZooName n;
  return sim_graph_concat(g, sim_zoo_name(&n, "%s.concat", block), 1, n_branches, xs);
}

/* The 3x3 average pooling (stride 1, same padding) of the A, C and E blocks. */
static int branch_avgpool(SimGraph *g, const char *block, int x)
{
  SimZooName n;
  return sim_graph_pool2d(g, sim_zoo_name(&n, "%s.branch_pool.avgpool", block), x, SIM_POOL_AVG,
                          3, 3, 1, 1, 1, 1);
}

static int inception_a(SimGraph *g, const char *blk, int x, int64_t pool_features)
{
  int b[4];
  b[0] = basic_conv(g, blk, "branch1x1", x, 64, 1, 1, 1, 0, 0);
  b[1] = basic_conv(g, blk, "branch5x5_1", x, 48, 1, 1, 1, 0, 0);
  b[1] = basic_conv(g, blk, "branch5x5_2", b[1], 64, 5, 5, 1, 2, 2);
  b[2] = basic_conv(g, blk, "branch3x3dbl_1", x, 64, 1, 1, 1, 0, 0);
  b[2] = basic_conv(g, blk, "branch3x3dbl_2", b[2], 96, 3, 3, 1, 1, 1);
  b[2] = basic_conv(g, blk, "branch3x3dbl_3", b[2], 96, 3, 3, 1, 1, 1);
  b[3] = branch_avgpool(g, blk, x);
  b[3] = basic_conv(g, blk, "branch_pool", b[3], pool_features, 1, 1, 1, 0, 0);
  return concat_branches(g, blk, 4, b);
}

static int inception_b(SimGraph *g, const char *blk, int x)
{
  SimZooName n;
  int b[3];
  b[0] = basic_conv(g, blk, "branch3x3", x, 384, 3, 3, 2, 0, 0);
  b[1] = basic_conv(g, blk, "branch3x3dbl_1", x, 64, 1, 1, 1, 0, 0);
  b[1] = basic_conv(g, blk, "branch3x3dbl_2", b[1], 96, 3, 3, 1, 1, 1);
  b[1] = basic_conv(g, blk, "branch3x3dbl_3", b[1], 96, 3, 3, 2, 0, 0);
  b[2] = sim_graph_pool2d(g, sim_zoo_name(&n, "%s.branch_pool.maxpool", blk), x, SIM_POOL_MAX,
                          3, 3, 2, 2, 0, 0);
  return concat_branches(g, blk, 3, b);
}

static int inception_c(SimGraph *g, const char *blk, int x, int64_t c7)
{
  int b[4];
  b[0] = basic_conv(g, blk, "branch1x1", x, 192, 1, 1, 1, 0, 0);
  b[1] = basic_conv(g, blk, "branch7x7_1", x, c7, 1, 1, 1, 0, 0);
  b[1] = basic_conv(g, blk, "branch7x7_2", b[1], c7, 1, 7, 1, 0, 3);
  b[1] = basic_conv(g, blk, "branch7x7_3", b[1], 192, 7, 1, 1, 3, 0);
  b[2] = basic_conv(g, blk, "branch7x7dbl_1", x, c7, 1, 1, 1, 0, 0);
  b[2] = basic_conv(g, blk, "branch7x7dbl_2", b[2], c7, 7, 1, 1, 3, 0);
  b[2] = basic_conv(g, blk, "branch7x7dbl_3", b[2], c7, 1, 7, 1, 0, 3);
  b[2] = basic_conv(g, blk, "branch7x7dbl_4", b[2], c7, 7, 1, 1, 3, 0);
  b[2] = basic_conv(g, blk, "branch7x7dbl_5", b[2], 192, 1, 7, 1, 0, 3);
  b[3] = branch_avgpool(g, blk, x);
  b[3] = basic_conv(g, blk, "branch_pool", b[3], 192, 1, 1, 1, 0, 0);
  return concat_branches(g, blk, 4, b);
}

static int inception_d(SimGraph *g, const char *blk, int x)
{
  SimZooName n;
  int b[3];
  b[0] = basic_conv(g, blk, "branch3x3_1", x, 192, 1, 1, 1, 0, 0);
  b[0] = basic_conv(g, blk, "branch3x3_2", b[0], 320, 3, 3, 2, 0, 0);
  b[1] = basic_conv(g, blk, "branch7x7x3_1", x, 192, 1, 1, 1, 0, 0);
  b[1] = basic_conv(g, blk, "branch7x7x3_2", b[1], 192, 1, 7, 1, 0, 3);
  b[1] = basic_conv(g, blk, "branch7x7x3_3", b[1], 192, 7, 1, 1, 3, 0);
  b[1] = basic_conv(g, blk, "branch7x7x3_4", b[1], 192, 3, 3, 2, 0, 0);
  b[2] = sim_graph_pool2d(g, sim_zoo_name(&n, "%s.branch_pool.maxpool", blk), x, SIM_POOL_MAX,
                          3, 3, 2, 2, 0, 0);
  return concat_branches(g, blk, 3, b);
}

static int inception_e(SimGraph *g, const char *blk, int x)
{
  SimZooName n;
  int b[4], pair[2];
  b[0] = basic_conv(g, blk, "branch1x1", x, 320, 1, 1, 1, 0, 0);

  int t = basic_conv(g, blk, "branch3x3_1", x, 384, 1, 1, 1, 0, 0);
  pair[0] = basic_conv(g, blk, "branch3x3_2a", t, 384, 1, 3, 1, 0, 1);
  pair[1] = basic_conv(g, blk, "branch3x3_2b", t, 384, 3, 1, 1, 1, 0);
  b[1] = sim_graph_concat(g, sim_zoo_name(&n, "%s.branch3x3.concat", blk), 1, 2, pair);

  t = basic_conv(g, blk, "branch3x3dbl_1", x, 448, 1, 1, 1, 0, 0);
  t = basic_conv(g, blk, "branch3x3dbl_2", t, 384, 3, 3, 1, 1, 1);
  pair[0] = basic_conv(g, blk, "branch3x3dbl_3a", t, 384, 1, 3, 1, 0, 1);
  pair[1] = basic_conv(g, blk, "branch3x3dbl_3b", t, 384, 3, 1, 1, 1, 0);
  b[2] = sim_graph_concat(g, sim_zoo_name(&n, "%s.branch3x3dbl.concat", blk), 1, 2, pair);

  b[3] = branch_avgpool(g, blk, x);
  b[3] = basic_conv(g, blk, "branch_pool", b[3], 192, 1, 1, 1, 0, 0);
  return concat_branches(g, blk, 4, b);
}

static SimGraph *build_inception_v3(const SimZooModel *model, const SimZooArgs *a,
                                    GError **error)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  int x = images_input(g, batch, sim_zoo_arg(a, "image"));

  x = basic_conv(g, "", "Conv2d_1a_3x3", x, 32, 3, 3, 2, 0, 0);
  x = basic_conv(g, "", "Conv2d_2a_3x3", x, 32, 3, 3, 1, 0, 0);
  x = basic_conv(g, "", "Conv2d_2b_3x3", x, 64, 3, 3, 1, 1, 1);
  x = sim_graph_pool2d(g, "maxpool1", x, SIM_POOL_MAX, 3, 3, 2, 2, 0, 0);
  x = basic_conv(g, "", "Conv2d_3b_1x1", x, 80, 1, 1, 1, 0, 0);
  x = basic_conv(g, "", "Conv2d_4a_3x3", x, 192, 3, 3, 1, 0, 0);
  x = sim_graph_pool2d(g, "maxpool2", x, SIM_POOL_MAX, 3, 3, 2, 2, 0, 0);

  x = inception_a(g, "Mixed_5b", x, 32);
  x = inception_a(g, "Mixed_5c", x, 64);
  x = inception_a(g, "Mixed_5d", x, 64);
  x = inception_b(g, "Mixed_6a", x);
  x = inception_c(g, "Mixed_6b", x, 128);
  x = inception_c(g, "Mixed_6c", x, 160);
  x = inception_c(g, "Mixed_6d", x, 160);
  x = inception_c(g, "Mixed_6e", x, 192);
  /* The auxiliary classifier of torchvision hangs off Mixed_6e during training; like
   * FlexFlow's and Unity's Inception-v3 this graph leaves it out. */
  x = inception_d(g, "Mixed_7a", x);
  x = inception_e(g, "Mixed_7b", x);
  x = inception_e(g, "Mixed_7c", x);

  x = global_avgpool(g, x);
  x = sim_graph_dropout(g, "dropout", x, 0.5);
  x = flatten(g, x, batch);
  x = sim_graph_linear(g, "fc", x, sim_zoo_arg(a, "classes"), TRUE, SIM_UNARY_IDENTITY);
  classification_loss(g, x, batch);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */

#define IMAGE_PARAMS(image)                                                              \
  { "batch", 64, "global batch size of one iteration" },                                \
  { "image", image, "height and width of the input images" },                           \
  { "classes", 1000, "classes of the classifier (ImageNet: 1000)" },                    \
  { NULL, 0, NULL }

static const SimModelParam image224_params[] = { IMAGE_PARAMS(224) };
static const SimModelParam image299_params[] = { IMAGE_PARAMS(299) };

const SimZooModel sim_zoo_cnn_models[] = {
  { "alexnet", "AlexNet, torchvision variant, 224x224 (61.1 M params, 0.71 GMACs/image)",
    image224_params, build_alexnet },
  { "vgg-16", "VGG-16, configuration D, 224x224 (138.4 M params, 15.5 GMACs/image)",
    image224_params, build_vgg16 },
  { "resnet-50", "ResNet-50 v1.5, torchvision, 224x224 (25.6 M params, 4.1 GMACs/image)",
    image224_params, build_resnet },
  { "resnet-101", "ResNet-101 v1.5, torchvision, 224x224 (44.5 M params, 7.8 GMACs/image)",
    image224_params, build_resnet },
  { "resnet-152", "ResNet-152 v1.5, torchvision, 224x224 (60.2 M params, 11.5 GMACs/image)",
    image224_params, build_resnet },
  { "resnext-50", "ResNeXt-50 32x4d, torchvision, 224x224 (25.0 M params, 4.3 GMACs/image)",
    image224_params, build_resnet },
  { "resnext-101", "ResNeXt-101 32x4d, 224x224 (44.2 M params, 8.0 GMACs/image)",
    image224_params, build_resnet },
  { "inception-v3", "Inception-v3 without auxiliary head, 299x299 (23.8 M params, 5.7 GMACs)",
    image299_params, build_inception_v3 },
  { NULL, NULL, NULL, NULL },
};
