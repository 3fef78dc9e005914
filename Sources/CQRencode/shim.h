#ifndef PEERMESH_CQRENCODE_SHIM_H
#define PEERMESH_CQRENCODE_SHIM_H
#include <qrencode.h>
#endif
