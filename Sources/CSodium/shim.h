#ifndef PEERMESH_CSODIUM_SHIM_H
#define PEERMESH_CSODIUM_SHIM_H
#include <sodium.h>
#endif
