#include "textflag.h"

// func skipPlainAVX2(b []byte) int
//
// Returns the length of the longest prefix of b, in whole 32-byte blocks, that holds no quote,
// no backslash and no byte below 0x20.
TEXT ·skipPlainAVX2(SB), NOSPLIT, $0-32
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), CX
	XORQ DX, DX
	MOVQ $0x22, AX
	MOVQ AX, X1
	VPBROADCASTB X1, Y1
	MOVQ $0x5c, AX
	MOVQ AX, X2
	VPBROADCASTB X2, Y2
	MOVQ $0x1f, AX
	MOVQ AX, X3
	VPBROADCASTB X3, Y3

loop:
	MOVQ CX, AX
	SUBQ DX, AX
	CMPQ AX, $32
	JB   done
	VMOVDQU (SI)(DX*1), Y0
	VPCMPEQB Y1, Y0, Y4
	VPCMPEQB Y2, Y0, Y5
	VPMINUB  Y3, Y0, Y6
	VPCMPEQB Y0, Y6, Y6
	VPOR     Y5, Y4, Y4
	VPOR     Y6, Y4, Y4
	VPMOVMSKB Y4, AX
	TESTL AX, AX
	JNZ  done
	ADDQ $32, DX
	JMP  loop

done:
	VZEROUPPER
	MOVQ DX, ret+24(FP)
	RET
