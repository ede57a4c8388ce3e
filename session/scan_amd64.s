//go:build !purego

#include "textflag.h"

// Nibble tables for the bytes that may follow a backslash but for 'u'
// ('"', '/', '\\', 'b', 'f', 'n', 'r', 't'): a byte is one of them when the
// entry of its high nibble and the entry of its low nibble share a bit. Each
// table is repeated for both 128-bit lanes of VPSHUFB.
DATA escHi<>+0(SB)/8, $0x0804020000010000
DATA escHi<>+8(SB)/8, $0x0000000000000000
DATA escHi<>+16(SB)/8, $0x0804020000010000
DATA escHi<>+24(SB)/8, $0x0000000000000000
GLOBL escHi<>(SB), RODATA|NOPTR, $32
DATA escLo<>+0(SB)/8, $0x00040008000d0000
DATA escLo<>+8(SB)/8, $0x0104000200000000
DATA escLo<>+16(SB)/8, $0x00040008000d0000
DATA escLo<>+24(SB)/8, $0x0104000200000000
GLOBL escLo<>(SB), RODATA|NOPTR, $32

// CLASSIFY sets m to the bits of the 32 bytes in data that are '"' (in Y4),
// '\\' (in Y5) or at most 0x1f (in Y6), using Y2 and Y3.
#define CLASSIFY(data, m) \
	VPCMPEQB  data, Y4, Y2 \
	VPCMPEQB  data, Y5, Y3 \
	VPOR      Y2, Y3, Y2   \
	VPMINUB   data, Y6, Y3 \
	VPCMPEQB  data, Y3, Y3 \
	VPOR      Y2, Y3, Y2   \
	VPMOVMSKB Y2, m

// func windowMasks(b []byte) (off int, quote, bslash, ctl, bad uint64)
TEXT ·windowMasks(SB), NOSPLIT, $0-64
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), CX
	XORQ AX, AX
	MOVQ $0x2222222222222222, DX
	MOVQ DX, X4
	VPBROADCASTQ X4, Y4
	MOVQ $0x5c5c5c5c5c5c5c5c, DX
	MOVQ DX, X5
	VPBROADCASTQ X5, Y5
	MOVQ $0x1f1f1f1f1f1f1f1f, DX
	MOVQ DX, X6
	VPBROADCASTQ X6, Y6

loop:
	LEAQ 64(AX), DX
	CMPQ DX, CX
	JHI  short
	VMOVDQU (SI)(AX*1), Y0
	VMOVDQU 32(SI)(AX*1), Y1
	CLASSIFY(Y0, BX)
	CLASSIFY(Y1, DI)
	SHLQ $32, DI
	ORQ  DI, BX
	JNZ  found
	ADDQ $64, AX
	JMP  loop

found:
	MOVQ AX, off+24(FP)

	VPCMPEQB  Y0, Y4, Y2
	VPMOVMSKB Y2, BX
	VPCMPEQB  Y1, Y4, Y2
	VPMOVMSKB Y2, DI
	SHLQ      $32, DI
	ORQ       DI, BX
	MOVQ      BX, quote+32(FP)

	VPCMPEQB  Y0, Y5, Y2
	VPMOVMSKB Y2, BX
	VPCMPEQB  Y1, Y5, Y2
	VPMOVMSKB Y2, DI
	SHLQ      $32, DI
	ORQ       DI, BX
	MOVQ      BX, bslash+40(FP)

	VPMINUB   Y0, Y6, Y2
	VPCMPEQB  Y0, Y2, Y2
	VPMOVMSKB Y2, BX
	VPMINUB   Y1, Y6, Y2
	VPCMPEQB  Y1, Y2, Y2
	VPMOVMSKB Y2, DI
	SHLQ      $32, DI
	ORQ       DI, BX
	MOVQ      BX, ctl+48(FP)

	// bad: the bytes that are not a simple escape's second byte.
	MOVQ         $0x0f0f0f0f0f0f0f0f, DX
	MOVQ         DX, X7
	VPBROADCASTQ X7, Y7
	VMOVDQU      escHi<>(SB), Y8
	VMOVDQU      escLo<>(SB), Y9
	VPXOR        Y10, Y10, Y10

	VPSRLW    $4, Y0, Y2
	VPAND     Y2, Y7, Y2
	VPSHUFB   Y2, Y8, Y2
	VPAND     Y0, Y7, Y3
	VPSHUFB   Y3, Y9, Y3
	VPAND     Y2, Y3, Y2
	VPCMPEQB  Y2, Y10, Y2
	VPMOVMSKB Y2, BX

	VPSRLW    $4, Y1, Y2
	VPAND     Y2, Y7, Y2
	VPSHUFB   Y2, Y8, Y2
	VPAND     Y1, Y7, Y3
	VPSHUFB   Y3, Y9, Y3
	VPAND     Y2, Y3, Y2
	VPCMPEQB  Y2, Y10, Y2
	VPMOVMSKB Y2, DI

	SHLQ $32, DI
	ORQ  DI, BX
	MOVQ BX, bad+56(FP)
	VZEROUPPER
	RET

short:
	MOVQ AX, off+24(FP)
	MOVQ $0, quote+32(FP)
	MOVQ $0, bslash+40(FP)
	MOVQ $0, ctl+48(FP)
	MOVQ $0, bad+56(FP)
	VZEROUPPER
	RET
